package train

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/elasticps/elasticps/elastic"
	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
)

// EpochCheck is the coordinator's exactly-once check of one epoch.
type EpochCheck = elastic.EpochCheck

// EventKind says what an Event reports.
type EventKind uint8

const (
	// EventStart: the cluster is up; Message says what is trained where.
	EventStart EventKind = iota + 1
	// EventRestore: a checkpoint was restored; Message says which and from where.
	EventRestore
	// EventProgress: periodic training figures (Progress).
	EventProgress
	// EventEval: an evaluation of the held-out set finished (Eval).
	EventEval
	// EventCheckpoint: a snapshot was taken (Checkpoint: blocking time, bytes) or skipped.
	EventCheckpoint
	// EventCommit: a snapshot was persisted and committed, or failed to be (Checkpoint).
	EventCommit
	// EventNote: something worth telling (Message), such as why training stops.
	EventNote
	// EventWarning: something went wrong that the run survived (Message), such as a damaged
	// checkpoint skipped at a resume; a program shows it even when it shows nothing else.
	EventWarning
)

// Event is one thing a run reports while it goes. Progress is filled in every event.
type Event struct {
	Kind       EventKind
	Progress   Progress
	Eval       Eval
	Checkpoint CheckpointEvent
	Message    string
}

// Progress is a picture of the run at one moment.
type Progress struct {
	Elapsed time.Duration // since the run started training
	// Samples is the number of samples the model has been trained on, including, after a
	// resume, those before the checkpoint; Steps likewise counts batches.
	Samples, Steps int64
	SamplesPerSec  float64 // over the last progress interval
	Loss           float64 // mean training loss of the batches of the last interval
	Epoch, Epochs  int     // current epoch (from 0) and the number configured
	// EpochDone and EpochRecords are the dispatcher's accepted positions of the current epoch
	// and its size.
	EpochDone, EpochRecords int64
	// Fraction is how much of the run is done: by time when a Duration is set, by data
	// otherwise (whichever is further).
	Fraction float64
	// LastEval is the newest evaluation (valid when HaveEval).
	LastEval Eval
	HaveEval bool
	// Checkpoints counts snapshots taken, Committed those committed; LastBlocked is the
	// blocking time of the newest snapshot.
	Checkpoints, Committed int
	LastBlocked            time.Duration
	// Moving is the change of the server count under way, if any.
	Moving *elastic.RepartitionStatus
}

// TableRows is the size of one table summed over the servers.
type TableRows struct {
	Name  string
	Dense bool // an MLP tensor
	Rows  int
	Bytes int64
}

// Summary is the outcome of a run.
type Summary struct {
	Data, HeldOut    string
	Servers, Workers int
	StopReason       string

	// Resumed is set when the run started from a checkpoint: ResumedStep and ResumedSamples are
	// its step and the samples the model had been trained on; ResumedFrom says where each
	// server's rows came from (shared memory or storage).
	Resumed        bool
	ResumedStep    uint64
	ResumedSamples int64
	ResumedFrom    string

	Samples       int64 // trained in this run
	TotalSamples  int64 // the model's total, including those before a resume
	Steps         int64 // the model's total steps
	Elapsed       time.Duration
	SamplesPerSec float64 // this run's samples over its training time

	// Evaluated is the step of the commit evaluated instead of training (Config.Evaluate), 0
	// for a training run.
	Evaluated uint64

	Eval Eval // the final evaluation of the held-out test set: the final model's, or the loaded commit's
	// BestTest is, with Config.KeepBest, the evaluation of the held-out test set on the best
	// commit (Best), when that is not the final model: after training, the commit is loaded
	// into fresh servers, as Evaluate "best" does, and scored. Nil otherwise, or when it could
	// not be loaded or scored: BestTestErr then says why, and the final model is reported.
	BestTest    *Eval
	BestTestErr string
	// Predictions is the file the test line's scores (Test) were written to (Config.Predictions; "" without):
	// a header line "file:line<TAB>label<TAB>score" (first column "record" for synthetic data,
	// the generator's index; "rating" for MovieLens, the ratings file and the rating's index
	// among its well-formed ratings after '#'), then one line per test record in the order of
	// the test set (files as given, lines in order), the label 0 or 1 and the score the
	// model's probability of a click.
	Predictions string
	// Valid is the final evaluation of the validation set (Config.ValidFraction), nil without.
	Valid *Eval
	// Best is, with Config.KeepBest, the evaluated commit with the best figure by
	// Config.BestMetric (of the validation set when there is one, else of the test set; nil when
	// none was evaluated and committed), SinceBest the evaluated commits after it and
	// Evaluations the evaluated commits, those before a resume included.
	Best                   *CommitEval
	SinceBest, Evaluations int
	BestMetric             Metric         // what Best was chosen by (Config.BestMetric)
	Ceiling                *model.Ceiling // synthetic data: the generator's own hidden model on the same records

	Epochs      []EpochCheck
	ExactlyOnce bool // every epoch passes its check
	// Recoveries counts the recoveries from parameter-server failures, and LostRecords the
	// positions whose updates to a failed server's slots were lost (-recovery partial; a
	// rollback loses none): those positions count as trained, once, but the model lacks their
	// updates on those slots.
	Recoveries  int
	LostRecords int64
	// AppliedBytes is the size of the servers' records of the batch positions they applied
	// (ps.Server.AppliedState, summed) at the end of the run: what keeps a replayed batch from
	// landing twice, saved with every checkpoint.
	AppliedBytes int64

	Tables      []TableRows
	Checkpoints CheckpointStats
	// Repartitions are the changes of the server count made while training (Config.ScaleAt).
	Repartitions []elastic.RepartitionStatus

	// BadLines counts the malformed lines of text data per file, with the first few by file and
	// line; its Err is set when they stopped the run. Zero for other data.
	BadLines shard.BadLinesReport
	// Overlap is what the check of the test records against the training records found (nil
	// for synthetic data, and in the coordinator's summary: only a run that reports a test
	// figure checks).
	Overlap *Overlap
	// Notes are what the summary points out about the input (such as every libSVM feature
	// landing in one field).
	Notes []string
}

// checkTraining fills in the exactly-once checks and the recoveries' losses from coord.
func (s *Summary) checkTraining(coord *elastic.Coordinator) {
	s.Epochs = coord.ExactlyOnce()
	s.ExactlyOnce = len(s.Epochs) > 0
	for _, e := range s.Epochs {
		s.ExactlyOnce = s.ExactlyOnce && e.OK()
	}
	st := coord.Status()
	s.Recoveries, s.LostRecords = st.Recoveries, st.LostRecords
}

// Verdict says in a few words whether every position was trained exactly once, and what the
// recoveries lost.
func (s *Summary) Verdict() string {
	switch {
	case !s.ExactlyOnce:
		return "FAILED: positions missing or covered twice"
	case s.LostRecords > 0:
		return fmt.Sprintf("every position covered exactly once, but %d positions' updates were LOST on the slots of failed servers (-recovery partial)", s.LostRecords)
	}
	return "every position of every epoch covered exactly once"
}

// String formats the summary for people, several lines.
func (s *Summary) String() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("summary (%s)", s.StopReason)
	p("  data:        %s", s.Data)
	for _, n := range s.Notes {
		p("  note:        %s", n)
	}
	p("  held out:    %s", s.HeldOut)
	if o := s.Overlap; o != nil && o.Records > 0 {
		p("  overlap:     %s", o)
	}
	if s.Evaluated != 0 {
		p("  commit:      step %d, loaded into %d parameter servers; nothing trained", s.Evaluated, s.Servers)
		s.evals(p)
		return b.String()
	}
	p("  cluster:     %d parameter servers, %d workers, dispatcher; loopback TCP with the cluster secret", s.Servers, s.Workers)
	if s.Resumed {
		p("  resumed:     from step %d (%d samples trained before), tables from %s", s.ResumedStep, s.ResumedSamples, s.ResumedFrom)
	}
	p("  trained:     %d samples in %v (%.0f samples/s); the model has seen %d samples in %d steps",
		s.Samples, s.Elapsed.Round(time.Millisecond), s.SamplesPerSec, s.TotalSamples, s.Steps)
	if s.BadLines.Bad > 0 || s.BadLines.Err != nil {
		var files []string
		for _, f := range s.BadLines.Files {
			if f.Bad > 0 {
				files = append(files, fmt.Sprintf("%s: %d of %d lines", f.File, f.Bad, f.Lines))
			}
		}
		p("  bad lines:   %d malformed lines skipped, not trained (%s)", s.BadLines.Bad, strings.Join(files, "; "))
		for _, e := range s.BadLines.Examples {
			p("    %s:%d: %v", e.File, e.Line, e.Err)
		}
		if e := s.BadLines.Err; e != nil {
			var be *shard.BadLinesError
			if errors.As(e, &be) {
				p("    STOPPED: %s: %s", be.File, be.Reason)
			}
		}
	}
	s.evals(p)
	if b := s.Best; b != nil {
		final, set := "", "test"
		if s.Valid != nil {
			final = fmt.Sprintf(" (final: validation AUC %.4f, log loss %.4f)", s.Valid.AUC, s.Valid.LogLoss)
		} else if s.Eval.Samples > 0 {
			final = fmt.Sprintf(" (final: AUC %.4f, log loss %.4f)", s.Eval.AUC, s.Eval.LogLoss)
		}
		if b.Set != "" {
			set = b.Set
		}
		p("  best:        %s AUC %.4f, log loss %.4f at the commit of step %d, after %d samples%s; chosen by %s; %d commits evaluated, %d after the best",
			set, b.AUC, b.LogLoss, b.Step, b.Trained, final, s.BestMetric, s.Evaluations, s.SinceBest)
	}
	for _, rp := range s.Repartitions {
		p("  servers:     %s", repartitionLine(rp))
	}
	var covered int64
	for _, e := range s.Epochs {
		covered += e.Covered
	}
	p("  exactly once: %s; %d positions covered, %d of them trained as samples (a position is a record, or a line of text data: held-out and malformed lines are covered without being trained)",
		s.Verdict(), covered, s.TotalSamples)
	if s.Recoveries > 0 {
		lost := "nothing lost"
		if s.LostRecords > 0 {
			lost = fmt.Sprintf("%d positions' updates lost on the restored slots (%.3f%% of the positions covered)", s.LostRecords, 100*float64(s.LostRecords)/float64(max(covered, 1)))
		}
		p("  recoveries:  %d from parameter-server failures; %s", s.Recoveries, lost)
	}
	for _, e := range s.Epochs {
		mark := "ok"
		if !e.OK() {
			mark = "MISMATCH"
		}
		p("    %s: %s", mark, epochLine(e))
	}
	p("    the servers' records of the batch positions they applied (saved with each checkpoint): %.1f KiB", float64(s.AppliedBytes)/1024)
	var rows, dense, denseRows int
	var bytes int64
	var cells []string
	for _, t := range s.Tables {
		bytes += t.Bytes
		if t.Dense {
			dense++
			denseRows += t.Rows
			continue
		}
		rows += t.Rows
		cells = append(cells, fmt.Sprintf("%s %d", strings.TrimPrefix(t.Name, embPrefix), t.Rows))
	}
	p("  tables:      %d embedding tables, %d rows; %d MLP tensors in %d rows of up to 1024 values; %.1f MiB on the servers",
		len(s.Tables)-dense, rows, dense, denseRows, float64(bytes)/(1<<20))
	for i := 0; i < len(cells); i += 6 {
		p("    rows: %s", strings.Join(cells[i:min(i+6, len(cells))], ", "))
	}
	c := s.Checkpoints
	p("  checkpoints: %d taken (%d full), %d committed, %d skipped, %d failed; newest committed step %d",
		c.Taken, c.Full, c.Committed, c.Skipped, c.Failed, c.LastCommitted)
	p("    training blocked %v per checkpoint on average, %v at most; %.1f MiB copied to shared memory, %.1f MiB written to storage; longest snapshot-to-commit %v",
		c.MeanBlocked().Round(time.Microsecond), c.MaxBlocked.Round(time.Microsecond), float64(c.Copied)/(1<<20), float64(c.Stored)/(1<<20), c.MaxPersist.Round(time.Millisecond))
	p("    stored in %s (shared memory: %s)", c.Dir, c.ShmDir)
	return b.String()
}

// epochLine describes an epoch's check in positions (EpochCheck's own text says "trained" for
// every covered position, held-out and malformed lines included).
func epochLine(e EpochCheck) string {
	state := "in progress"
	if e.Complete {
		state = "complete"
	}
	out := fmt.Sprintf("epoch %d (%s): %d of %d positions covered, the dispatcher counted %d, %d covered twice",
		e.Epoch, state, e.Covered, e.Records, e.Accepted, e.Duplicates)
	if e.Failed > 0 {
		out += fmt.Sprintf(", %d in failed shards", e.Failed)
	}
	if e.FirstDuplicate >= 0 {
		out += fmt.Sprintf(" (first: position %d)", e.FirstDuplicate)
	}
	return out
}

// Test is the test evaluation the summary's test line reports, and Predictions holds: the best
// commit's (BestTest) when keep-best chose one before the final model, else Eval.
func (s *Summary) Test() Eval {
	if s.BestTest != nil {
		return *s.BestTest
	}
	return s.Eval
}

// evals prints the final evaluations.
func (s *Summary) evals(p func(format string, a ...any)) {
	if v := s.Valid; v != nil {
		p("  validation:  AUC %.4f, log loss %.4f on %d validation records (carved from the training data, not trained)", v.AUC, v.LogLoss, v.Samples)
	}
	if s.Eval.Samples == 0 {
		p("  test:        not evaluated (nothing trained, or the run failed)")
		return
	}
	t, ceiling, which := s.Test(), "", ""
	if s.Ceiling != nil {
		ceiling = fmt.Sprintf(" (the generator's hidden model: AUC %.4f, log loss %.4f)", s.Ceiling.AUC, s.Ceiling.LogLoss)
	}
	switch b := s.Best; {
	case s.BestTest != nil:
		which = fmt.Sprintf(": the best commit's (step %d); the final model's: AUC %.4f, log loss %.4f", b.Step, s.Eval.AUC, s.Eval.LogLoss)
	case b != nil && b.Step == uint64(s.Steps):
		which = fmt.Sprintf(": the final model's, which is the best commit (step %d)", b.Step)
	case b != nil:
		which = fmt.Sprintf(": the final model's; the best commit (step %d) could not be scored: %s", b.Step, s.BestTestErr)
	}
	p("  test:        AUC %.4f, log loss %.4f on %d held-out records%s%s", t.AUC, t.LogLoss, t.Samples, ceiling, which)
	if s.Predictions != "" {
		p("  predictions: %s: the test records' labels and this model's scores, %d lines after the header", s.Predictions, t.Samples)
	}
}
