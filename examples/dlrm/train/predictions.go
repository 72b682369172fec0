package train

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/elasticps/elasticps/examples/dlrm/model"
)

// ErrSoftLabel is returned by Run when a held-out record (test or validation) has a soft label,
// a value strictly between 0 and 1: AUC is defined on clicks, so held-out records must be 0 or 1
// (-1 and +1 read as 0 and 1). The error names the record's file and line. Soft labels may be
// trained.
var ErrSoftLabel = errors.New("train: a held-out record has a soft label")

// origins says where each record of a held-out set comes from, for the predictions file and
// for errors about a record: a file and a line for text data, the index of the rating for
// MovieLens, the generator's record index for synthetic data.
type origins struct {
	column string   // the predictions file's name for the first column
	files  []string // text data: the files, by origin.file
	byName map[string]int32
	at     []origin
	name   func(string) string // text data: the path of a file name as read
}

// origin is one record's: its file (an index into origins.files, -1 for none) and its line, or
// its rating or record index.
type origin struct {
	file int32
	line int64
}

// textOrigins records file:line origins; name turns a shard's file name into the path shown.
func textOrigins(name func(string) string) *origins {
	return &origins{column: "file:line", byName: map[string]int32{}, name: name}
}

// indexOrigins names records by index, from base; column names the index.
func indexOrigins(column string, base int64, n int) *origins {
	o := &origins{column: column, at: make([]origin, n)}
	for i := range o.at {
		o.at[i] = origin{file: -1, line: base + int64(i)}
	}
	return o
}

// ratingOrigins names MovieLens records by their rating's index in the ratings file path (its
// well-formed ratings counted from 0, in file order).
func ratingOrigins(path string, idx []int) *origins {
	o := &origins{column: "rating", files: []string{path}, at: make([]origin, len(idx))}
	for i, r := range idx {
		o.at[i] = origin{line: int64(r)}
	}
	return o
}

// add records the origin of the next record: line of file (a shard's file name).
func (o *origins) add(file string, line int64) {
	if o == nil {
		return
	}
	f, ok := o.byName[file]
	if !ok {
		f = int32(len(o.files))
		o.byName[file] = f
		o.files = append(o.files, o.name(file))
	}
	o.at = append(o.at, origin{file: f, line: line})
}

// String returns the origin of record i as the predictions file's first column writes it.
func (o *origins) String(i int) string {
	if o == nil || i >= len(o.at) {
		return "record " + strconv.Itoa(i) // never written: every held-out set has its origins
	}
	at := o.at[i]
	switch {
	case at.file < 0:
		return strconv.FormatInt(at.line, 10)
	case o.column == "rating":
		return o.files[at.file] + "#" + strconv.FormatInt(at.line, 10)
	}
	return o.files[at.file] + ":" + strconv.FormatInt(at.line, 10)
}

// checkClicks refuses a held-out set with a soft label, naming the first such record by its
// origin (file:line for text data).
func checkClicks(set string, samples []model.Sample, at *origins) error {
	for i := range samples {
		if y := samples[i].Label; y != 0 && y != 1 {
			return fmt.Errorf("%w: %s: label %v in the %s set: AUC is defined on clicks, so every held-out record must be 0 or 1 (or -1/+1); train on soft labels if you like, but hold out (-test) records with clicks",
				ErrSoftLabel, at.String(i), y, set)
		}
	}
	return nil
}

// sigmoid is the probability of logit z, computed on the side that keeps small probabilities
// exact.
func sigmoid(z float32) float64 {
	x := float64(z)
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

// writePredictions writes the scores of the last run of e to path: a header line, then one line
// per record, "origin<TAB>label<TAB>score" in the order of the set, the score the model's
// probability of a click printed so that it reads back as the same float64 (ranked as the
// logits are, but for logits above about 23, where neighbouring float32 logits can round to
// one probability, and about 37.4, from which every probability is 1). The file is
// written to a temporary file in the same directory, synced and renamed into place, and the
// directory synced: a reader sees the old file or the whole new one.
func writePredictions(path string, e *evaluator, at *origins) error {
	if len(e.labels) != len(e.test) || len(e.logits) != len(e.test) {
		return fmt.Errorf("predictions: the evaluation scored %d of %d records", len(e.logits), len(e.test))
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("predictions: %w", err)
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	w := bufio.NewWriterSize(f, 1<<16)
	column := "record"
	if at != nil {
		column = at.column
	}
	fmt.Fprintf(w, "%s\tlabel\tscore\n", column)
	var buf []byte
	for i, y := range e.labels {
		buf = append(buf[:0], at.String(i)...)
		buf = append(buf, '\t')
		buf = strconv.AppendFloat(buf, float64(y), 'g', -1, 32)
		buf = append(buf, '\t')
		buf = strconv.AppendFloat(buf, sigmoid(e.logits[i]), 'g', -1, 64)
		buf = append(buf, '\n')
		w.Write(buf)
	}
	err = errors.Join(w.Flush(), f.Sync(), f.Close())
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("predictions: write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// writePredictions writes the scores of the test evaluation s's test line reports (Summary.Test:
// the best commit's with keep-best, else the final model's or the loaded commit's) to
// Config.Predictions, if set, and names the file in s. The last run of e, a test evaluator,
// must be that evaluation: its AUC is checked against s's.
func (r *run) writePredictions(s *Summary, e *evaluator) error {
	if r.cfg.Predictions == "" {
		return nil
	}
	want := s.Test().AUC
	auc, err := model.AUC(e.labels, e.logits)
	if err != nil || auc != want {
		return fmt.Errorf("predictions: the test evaluator's last scores (AUC %v, %v) are not those of the summary's test line (AUC %v)", auc, err, want)
	}
	if err := writePredictions(r.cfg.Predictions, e, r.data.testAt); err != nil {
		return err
	}
	s.Predictions = r.cfg.Predictions
	return nil
}

// checkPredictionsPath refuses, before anything is trained, a predictions file that could not be
// written: a directory, or one in a directory that does not exist or cannot be written.
func checkPredictionsPath(path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("%w: predictions file %s is a directory", ErrConfig, path)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("%w: predictions file %s cannot be written: %v", ErrConfig, path, err)
	}
	f.Close()
	return os.Remove(f.Name())
}
