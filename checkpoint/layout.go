package checkpoint

import (
	"fmt"
	"strconv"
	"strings"
)

// Storage layout of a job (every name starts with the job):
//
//	JOB/commits/STEP                       commit record of STEP (the job-level second phase)
//	JOB/data/STEP/NODE/ID/manifest         manifest of NODE's checkpoint at STEP, written last
//	JOB/data/STEP/NODE/ID/tT-sLO-pP        chunk: records of table T for slots [LO, ...), part P
//	JOB/data/STEP/NODE/ID/bI               blob I of the node
//	JOB/data/STEP/_coordinator/ID/bI       blob I saved by Commit
//
// STEP is 20 decimal digits, so names sort by step; ID is 16 hex digits, unique per persist attempt, so
// a retry or a re-run of the same step never overwrites objects a commit may point to.

const coordinatorNode = "_coordinator"

func stepName(step uint64) string { return fmt.Sprintf("%020d", step) }

func commitsPrefix(job string) string           { return job + "/commits/" }
func commitName(job string, step uint64) string { return commitsPrefix(job) + stepName(step) }
func dataPrefix(job string) string              { return job + "/data/" }

func persistDir(job string, step uint64, node string, id uint64) string {
	return fmt.Sprintf("%s/data/%s/%s/%016x", job, stepName(step), node, id)
}

func manifestName(dir string) string { return dir + "/manifest" }

func chunkObject(table, slotLo, part int) string {
	return fmt.Sprintf("t%d-s%d-p%d", table, slotLo, part)
}
func blobObject(i int) string { return fmt.Sprintf("b%d", i) }

// parseStep parses a 20-digit step component.
func parseStep(s string) (uint64, bool) {
	if len(s) != 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 10, 64)
	return v, err == nil
}

// dataStep returns the step of an object under JOB/data/.
func dataStep(job, name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, dataPrefix(job))
	if !ok {
		return 0, false
	}
	s, _, _ := strings.Cut(rest, "/")
	return parseStep(s)
}

// validIdent reports whether s can name a job, node, table or blob: 1 to 128 bytes of letters, digits,
// '.', '_' and '-', not "." or "..".
func validIdent(s string) bool {
	if s == "" || len(s) > 128 || s == "." || s == ".." {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-'
		if !ok {
			return false
		}
	}
	return !strings.HasPrefix(s, ".tmp")
}
