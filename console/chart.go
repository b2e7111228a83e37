package console

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/oncegate/oncegate/admin"
)

// Chart geometry: one point per minute of the last hour.
const (
	chartW = 180
	chartH = 36
)

// chart draws an effect type's last hour as a small SVG: created, delivered and failed per minute, one line
// each, on one scale (the busiest minute of the three). Drawn on the server, styled by console.css through
// classes (no inline style, which the Content-Security-Policy forbids), with a title per line for the totals.
func chart(t admin.TypeOverview) template.HTML {
	peak := 1
	for i := range admin.Minutes {
		peak = max(peak, t.Created[i], t.Delivered[i], t.Failed[i])
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartW, chartH+2, chartW, chartH+2, template.HTMLEscapeString(fmt.Sprintf(
			"last hour: %d created, %d delivered, %d failed (peak %d a minute)",
			sum(t.Created), sum(t.Delivered), sum(t.Failed), peak)))
	line := func(class, name string, v [admin.Minutes]int) {
		fmt.Fprintf(&b, `<polyline class="%s" points="`, class)
		for i, n := range v {
			x := float64(i) * float64(chartW-1) / float64(admin.Minutes-1)
			y := 1 + float64(chartH) - float64(n)*float64(chartH)/float64(peak)
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		fmt.Fprintf(&b, `"><title>%s: %d in the last hour</title></polyline>`, name, sum(v))
	}
	line("created", "created", t.Created)
	line("delivered", "delivered", t.Delivered)
	line("failed", "failed, dead or unknown", t.Failed)
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

func sum(v [admin.Minutes]int) int {
	n := 0
	for _, x := range v {
		n += x
	}
	return n
}
