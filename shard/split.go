package shard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
)

// SplitConfig configures SplitText.
type SplitConfig struct {
	// RecordsPerShard is the number of lines per shard (the last shard of each file may be
	// shorter). Default 8192. At most MaxShardRecords.
	RecordsPerShard int64
	// HeaderLines is the number of lines at the top of every file that are not records (1 for a
	// CSV header). Default 0.
	HeaderLines int
}

// SplitText scans the files (names within fsys) and cuts them into KindText shards of
// RecordsPerShard lines each, at line boundaries: one record per line, a last line without a
// trailing newline included, empty lines included (a parser decides about them). A shard never
// spans two files. The scan reads every byte once and holds one buffer; ctx is checked between
// buffers. Pass the result to TextDataset.
func SplitText(ctx context.Context, fsys fs.FS, files []string, cfg SplitConfig) ([]Shard, error) {
	if cfg.RecordsPerShard == 0 {
		cfg.RecordsPerShard = 8192
	}
	if cfg.RecordsPerShard < 0 || cfg.RecordsPerShard > MaxShardRecords || cfg.HeaderLines < 0 {
		return nil, fmt.Errorf("%w: RecordsPerShard %d, HeaderLines %d", ErrInvalidConfig, cfg.RecordsPerShard, cfg.HeaderLines)
	}
	var out []Shard
	buf := make([]byte, 256<<10)
	for _, name := range files {
		f, err := fsys.Open(name)
		if err != nil {
			return nil, fmt.Errorf("shard: split: %w", err)
		}
		out, err = splitFile(ctx, f, name, cfg, buf, out)
		_ = f.Close()
		if err != nil {
			return nil, err
		}
	}
	var base int64
	for i := range out {
		out[i].Index, out[i].Base = i, base
		base += out[i].Records
	}
	return out, nil
}

func splitFile(ctx context.Context, r io.Reader, name string, cfg SplitConfig, buf []byte, out []Shard) ([]Shard, error) {
	var (
		pos       int64 // bytes consumed
		lineStart int64 // byte where the current line starts
		line      int64 // 1-based number of the current line
		cur       = Shard{Kind: KindText, File: name, Start: -1}
	)
	line = 1
	endLine := func(next int64) { // the line ending just before byte next is complete
		if line > int64(cfg.HeaderLines) {
			if cur.Start < 0 {
				cur.Start, cur.Line = lineStart, line
			}
			cur.Records++
			if cur.Records == cfg.RecordsPerShard {
				cur.End = next
				out = append(out, cur)
				cur = Shard{Kind: KindText, File: name, Start: -1}
			}
		}
		line++
		lineStart = next
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, err := r.Read(buf)
		chunk := buf[:n]
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			if i < 0 {
				pos += int64(len(chunk))
				break
			}
			pos += int64(i) + 1
			chunk = chunk[i+1:]
			endLine(pos)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("shard: split %s: %w", name, err)
		}
	}
	if pos > lineStart { // a last line without a newline
		endLine(pos)
	}
	if cur.Start >= 0 {
		cur.End = pos
		out = append(out, cur)
	}
	return out, nil
}
