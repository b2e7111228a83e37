package console

import (
	"fmt"
	"html/template"
	"strings"

	"github.com/oncegate/oncegate/admin"
)

// Chart geometry: one point per minute of the last hour, in two panels over one time axis: created and
// delivered on the upper panel, failures on the lower one, each panel on its own scale (on one scale a few
// failures were a flat line under thousands of deliveries, and on-call could not see them).
const (
	chartW      = 420 // the whole chart
	chartLeft   = 44  // room for the y labels
	chartRight  = 8
	chartTop    = 8
	chartUpperH = 70 // created and delivered
	chartGap    = 14
	chartLowerH = 30 // failed, dead or unknown
	chartBottom = 18 // room for the x labels
	chartH      = chartTop + chartUpperH + chartGap + chartLowerH + chartBottom
)

// chart draws an effect type's last hour as an SVG with axes: per-minute created and delivered above,
// failures below, each panel with its peak and zero marked and gridlines at a quarter hour, minutes ago
// along the bottom. Drawn on the server, styled by console.css through classes (no inline style, which the
// Content-Security-Policy forbids), with a title per line for the totals.
func chart(t admin.TypeOverview) template.HTML {
	upper, lower := 1, 1
	for i := range admin.Minutes {
		upper = max(upper, t.Created[i], t.Delivered[i])
		lower = max(lower, t.Failed[i])
	}
	plotW := float64(chartW - chartLeft - chartRight)
	x := func(i int) float64 { return chartLeft + float64(i)*plotW/float64(admin.Minutes-1) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" viewBox="0 0 %d %d" width="%d" height="%d" role="img" aria-label="%s">`,
		chartW, chartH, chartW, chartH, template.HTMLEscapeString(fmt.Sprintf(
			"last hour: %d created, %d delivered, %d failed (peaks %d and %d a minute)",
			sum(t.Created), sum(t.Delivered), sum(t.Failed), upper, lower)))
	panel := func(top, height, peak int, label string) {
		bottom := top + height
		for q := 0; q <= 4; q++ { // a gridline every quarter hour
			gx := x(q * (admin.Minutes - 1) / 4)
			fmt.Fprintf(&b, `<line class="grid" x1="%.1f" y1="%d" x2="%.1f" y2="%d"/>`, gx, top, gx, bottom)
		}
		fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, top, chartLeft, bottom)
		fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, chartLeft, bottom, chartW-chartRight, bottom)
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%d" text-anchor="end">%d/min</text>`, chartLeft-4, top+8, peak)
		fmt.Fprintf(&b, `<text class="tick" x="%d" y="%d" text-anchor="end">0</text>`, chartLeft-4, bottom)
		fmt.Fprintf(&b, `<text class="panel-label" x="%d" y="%d">%s</text>`, chartLeft+4, top+9, label)
	}
	line := func(class, name string, v [admin.Minutes]int, top, height, peak int) {
		fmt.Fprintf(&b, `<polyline class="%s" points="`, class)
		for i, n := range v {
			y := float64(top+height) - float64(n)*float64(height)/float64(peak)
			fmt.Fprintf(&b, "%.1f,%.1f ", x(i), y)
		}
		fmt.Fprintf(&b, `"><title>%s: %d in the last hour</title></polyline>`, name, sum(v))
	}
	lowerTop := chartTop + chartUpperH + chartGap
	panel(chartTop, chartUpperH, upper, "created · delivered")
	panel(lowerTop, chartLowerH, lower, "failed")
	line("created", "created", t.Created, chartTop, chartUpperH, upper)
	line("delivered", "delivered", t.Delivered, chartTop, chartUpperH, upper)
	line("failed", "failed, dead or unknown", t.Failed, lowerTop, chartLowerH, lower)
	for q, label := range []string{"-60m", "-45m", "-30m", "-15m", "now"} {
		anchor := "middle"
		switch q {
		case 0:
			anchor = "start"
		case 4:
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text class="tick" x="%.1f" y="%d" text-anchor="%s">%s</text>`, x(q*(admin.Minutes-1)/4),
			chartH-4, anchor, label)
	}
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

// rateBar draws a success rate as a small horizontal bar, styled by class (good, fair, poor).
func rateBar(rate float64) template.HTML {
	const w, h = 80, 10
	class := "good"
	switch {
	case rate < 0.9:
		class = "poor"
	case rate < 0.99:
		class = "fair"
	}
	return template.HTML(fmt.Sprintf(`<svg class="rate-bar" viewBox="0 0 %d %d" width="%d" height="%d" aria-hidden="true">`+
		`<rect class="track" x="0" y="0" width="%d" height="%d"/><rect class="%s" x="0" y="0" width="%.1f" height="%d"/></svg>`,
		w, h, w, h, w, h, class, rate*w, h))
}
