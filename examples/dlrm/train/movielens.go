package train

import (
	"fmt"
	"math"

	"github.com/elasticps/elasticps/examples/dlrm/model"
	"github.com/elasticps/elasticps/shard"
)

// userDayField names the field MovieLens records gain with Config.UserDay.
const userDayField = "user_day"

// rareID is the id that every id of a field seen fewer than Config.MinCount times among the
// training records is replaced with: one shared row per field. Real ids are 64-bit hashes, so
// this one is as unlikely to meet one of them as any two of them are to meet each other.
const rareID = 0x72617265_5f696473 // "rare_ids"

// movieLensFields returns the sparse fields of MovieLens records as the model sees them: the
// reader's, then user_day with Config.UserDay (cfg with defaults filled in).
func movieLensFields(cfg *Config) []string {
	fields := append([]string(nil), shard.MovieLensRatings{}.Schema().Fields...)
	if cfg.UserDay == SwitchOn {
		fields = append(fields, userDayField)
	}
	return fields
}

// movieLensPooling returns the pooling of each field of movieLensFields: mean for the genres
// (zero to ten of them), sum (one id or none) for the others.
func movieLensPooling(fields []string) []model.Pooling {
	pooling := make([]model.Pooling, len(fields))
	pooling[shard.MovieLensFieldGenre] = model.PoolMean
	return pooling
}

// fieldID is an id of one field.
type fieldID struct {
	field int
	id    uint64
}

// movieLensFeatures turns the records of the MovieLens reader into those the model trains on and
// evaluates: it adds the user_day field (Config.UserDay) and replaces every id seen fewer than
// Config.MinCount times among the training ratings with its field's rare id. It is immutable once
// built and safe for concurrent use.
type movieLensFeatures struct {
	userDay  bool
	minCount int32
	seen     map[fieldID]int32 // training occurrences of each id (with minCount > 1)
}

// newMovieLensFeatures counts the ids of the training ratings train of ml (cfg with defaults
// filled in). Only the training ratings are counted: the validation and test ratings are
// neither labels nor counts to the model.
func newMovieLensFeatures(cfg *Config, ml *shard.MovieLens, train []int) (*movieLensFeatures, error) {
	f := &movieLensFeatures{userDay: cfg.UserDay == SwitchOn, minCount: int32(cfg.MinCount)}
	if f.minCount <= 1 {
		return f, nil
	}
	f.seen = make(map[fieldID]int32)
	var rec shard.Record
	for _, i := range train {
		if err := ml.ReadRecord(int64(i), &rec); err != nil {
			return nil, err
		}
		f.derive(&rec)
		for fi := range rec.FieldEnds {
			for _, id := range rec.Field(fi) {
				f.seen[fieldID{fi, id}]++
			}
		}
	}
	return f, nil
}

// read fills rec with rating i of ml as the model sees it.
func (f *movieLensFeatures) read(ml *shard.MovieLens, i int, rec *shard.Record) error {
	if err := ml.ReadRecord(int64(i), rec); err != nil {
		return err
	}
	f.derive(rec)
	if f.seen != nil {
		for fi := range rec.FieldEnds {
			ids := rec.Field(fi)
			for j, id := range ids {
				if f.seen[fieldID{fi, id}] < f.minCount {
					ids[j] = rareID
				}
			}
		}
	}
	return nil
}

// derive appends the derived fields to a record of the reader.
func (f *movieLensFeatures) derive(rec *shard.Record) {
	if !f.userDay {
		return
	}
	// The reader's first dense feature is the rating's time in years since 1995 over 25, as a
	// float32: about a minute of rounding, so a rating within a minute of midnight (UTC) may
	// count to the next day or the one before.
	day := int64(math.Floor(float64(rec.Dense[0]) * 25 * 365.25))
	user := rec.Field(shard.MovieLensFieldUser)[0]
	rec.IDs = append(rec.IDs, mixID(user, uint64(day)))
	rec.EndField()
}

// mixID combines a user's id and a day number into one well-mixed id (SplitMix64's finaliser
// over the pair).
func mixID(a, b uint64) uint64 {
	z := a ^ (b+0x9e3779b97f4a7c15)*0xbf58476d1ce4e5b9
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// samples reads the ratings idx of ml into samples.
func (f *movieLensFeatures) samples(ml *shard.MovieLens, idx []int) ([]model.Sample, error) {
	var rec shard.Record
	out := make([]model.Sample, len(idx))
	for i, j := range idx {
		if err := f.read(ml, j, &rec); err != nil {
			return nil, err
		}
		sampleFromRecord(&out[i], &rec)
	}
	return out, nil
}

// dataset is the training ratings idx of ml as an indexed data set: record i is rating idx[i].
func (f *movieLensFeatures) dataset(ml *shard.MovieLens, idx []int) shard.Indexed {
	return shard.IndexedFunc(int64(len(idx)), func(i int64, rec *shard.Record) error {
		return f.read(ml, idx[i], rec)
	})
}

// describe says what the features add, for the data description ("" when nothing).
func (f *movieLensFeatures) describe() string {
	s := ""
	if f.userDay {
		s += "; field user_day: the user and the UTC day of the rating"
	}
	if f.minCount > 1 {
		rare := 0
		for _, n := range f.seen {
			if n < f.minCount {
				rare++
			}
		}
		s += fmt.Sprintf("; ids seen fewer than %d times in training share one row per field (%d of %d ids)", f.minCount, rare, len(f.seen))
	}
	return s
}
