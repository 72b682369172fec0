package ps

import (
	"context"
	"fmt"

	"github.com/elasticps/elasticps/checkpoint"
	"github.com/elasticps/elasticps/embedding"
)

// digestChunk is the most raw-record bytes Digest copies out of a table at a time.
const digestChunk = 1 << 20

// Digest returns the digest of the rows this server holds of the slots t gives it (nil t: its
// current owner table), in every table and dense tensor it hosts: its part of the job's model
// (checkpoint.Digest; the parts of every server of one table add up with checkpoint.Merge). It
// returns ErrNoTable when t is nil and the server has none yet.
//
// It reads each table a few hundred rows at a time while the server serves, so it holds no lock
// for long, and it is consistent across rows only while nothing writes them: a coordinator
// takes it with training held at a barrier (elastic.Coordinator.Digest). ctx is checked
// between chunks.
func (s *Server) Digest(ctx context.Context, t *OwnerTable) (checkpoint.Digest, error) {
	if t == nil {
		if t = s.OwnerTable(); t == nil {
			return checkpoint.Digest{}, ErrNoTable
		}
	}
	if t.Slots != s.cfg.Slots {
		return checkpoint.Digest{}, fmt.Errorf("%w: owner table has %d slots, server %d", ErrBadConfig, t.Slots, s.cfg.Slots)
	}
	set := t.SlotsOf(s.cfg.ID)
	var out checkpoint.Digest
	var buf []byte
	for _, name := range s.TableNames() {
		tab, ok := s.Table(name)
		if !ok {
			continue // dropped meanwhile
		}
		td := checkpoint.TableDigest{Name: name, Schema: tab.Schema()}
		for cur := (embedding.Cursor{}); cur.Shard < tab.Shards(); {
			if err := ctx.Err(); err != nil {
				return checkpoint.Digest{}, err
			}
			buf, cur = tab.AppendRawRows(buf[:0], cur, digestChunk, set)
			if err := td.Add(buf, tab.RawRowSize()); err != nil {
				return checkpoint.Digest{}, fmt.Errorf("ps: digest of %s on %s: %w", name, s.cfg.ID, err)
			}
		}
		out.Tables = append(out.Tables, td)
	}
	return out, nil
}
