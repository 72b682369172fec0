package metrics_test

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// dashboardPath is the Grafana dashboard built on the package's series.
const dashboardPath = "../examples/grafana/elasticps.json"

// dashExpr is one PromQL expression of the dashboard, with its panel's title.
type dashExpr struct {
	panel, expr string
}

// instant is the expression with Grafana's variables set, as a query to Prometheus sends it.
func (e dashExpr) instant() string {
	return strings.NewReplacer("$__rate_interval", "1m", "$training_job", jobName).Replace(e.expr)
}

// dashboard is the part of a Grafana dashboard the test reads.
type dashboard struct {
	Title      string `json:"title"`
	UID        string `json:"uid"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
			Type string `json:"type"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		ID         int    `json:"id"`
		Type       string `json:"type"`
		Title      string `json:"title"`
		Datasource struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		GridPos struct {
			H, W, X, Y int
		} `json:"gridPos"`
		Targets []struct {
			RefID string `json:"refId"`
			Expr  string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// dashboardExprs reads the dashboard, checks its shape and returns its expressions.
func dashboardExprs(t *testing.T) []dashExpr {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	require.NoError(t, err)
	require.True(t, json.Valid(b), "the dashboard is not valid JSON")
	var d dashboard
	require.NoError(t, json.Unmarshal(b, &d))
	assert.NotEmpty(t, d.Title)
	assert.NotEmpty(t, d.UID)
	var vars []string
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	assert.ElementsMatch(t, []string{"datasource", "training_job"}, vars)
	ids := map[int]bool{}
	var out []dashExpr
	for _, p := range d.Panels {
		assert.False(t, ids[p.ID], "panel id %d twice", p.ID)
		ids[p.ID] = true
		assert.Positive(t, p.GridPos.W, p.Title)
		assert.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, p.Title)
		if p.Type == "row" {
			continue
		}
		assert.Equal(t, "${datasource}", p.Datasource.UID, p.Title)
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			require.NotEmpty(t, tg.Expr, "panel %q", p.Title)
			assert.Contains(t, tg.Expr, `training_job="$training_job"`, "panel %q: one job at a time", p.Title)
			out = append(out, dashExpr{panel: p.Title, expr: tg.Expr})
		}
	}
	require.NotEmpty(t, out)
	return out
}

// metricName matches the series names an expression uses: the package's and the process's.
// (Label names and values never start so.)
var metricName = regexp.MustCompile(`\b(?:elasticps|process|go)_[a-z0-9_]+\b`)

// TestDashboard holds the dashboard to the exposition of a running job: every series name its
// expressions use exists (a histogram's only as _bucket, _sum or _count), and every series of
// the package is on it.
func TestDashboard(t *testing.T) {
	exprs := dashboardExprs(t)
	_, expo := trainedJob(t)
	exposed := map[string]dto.MetricType{}
	for _, s := range expo {
		for name, mf := range s.mfs {
			exposed[name] = mf.GetType()
		}
	}
	// The families absent from this job's expositions (hot slots of the idle server are
	// present on the others) are still the package's: take their types from the table.
	for _, fams := range families {
		for name, typ := range fams {
			if _, ok := exposed[name]; !ok && optional[name] {
				exposed[name] = typ
			}
		}
	}
	used := map[string]bool{}
	for _, e := range exprs {
		names := metricName.FindAllString(e.expr, -1)
		require.NotEmpty(t, names, "panel %q: %s names no series", e.panel, e.expr)
		for _, name := range names {
			family, ok := name, false
			if typ, found := exposed[name]; found {
				ok = typ != dto.MetricType_HISTOGRAM // a classic histogram has no series of its bare name
			}
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suffix); cut && exposed[base] == dto.MetricType_HISTOGRAM {
					family, ok = base, true
				}
			}
			assert.True(t, ok, "panel %q uses %s, which a running job does not expose", e.panel, name)
			used[family] = true
		}
	}
	var missing []string
	for _, fams := range families {
		for name := range fams {
			if !used[name] {
				missing = append(missing, name)
			}
		}
	}
	slices.Sort(missing)
	assert.Empty(t, missing, "series on no panel of the dashboard")
}
