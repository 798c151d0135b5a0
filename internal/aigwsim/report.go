package aigwsim

import (
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
)

// Window is what happened in one window of the limit.
type Window struct {
	Start time.Time
	// Full: the load ran through the whole window.
	Full bool
	// Charged is the hits_addend of the stream-done calls sent in the
	// window: the tokens spent upstream, as the server was told.
	Charged uint64
	// Admitted is the hits_addend of the stream-done calls of the streams
	// whose request-time call was sent in the window, whenever they
	// ended: what the window admitted, which a server that reserves at
	// the request-time call bounds (docs/algorithms.md, reservations).
	Admitted uint64
	// Offered is the cost of the request-time calls sent in the window of
	// streams that would have been charged had they been admitted
	// (Complete ones): the demand. A refused stream retried counts again.
	Offered uint64
	// Asked and Refused count the request-time calls sent in the window
	// and those refused.
	Asked, Refused int
}

// Report is the measurement of a Run against a limit of Limit tokens per
// Window.
type Report struct {
	Limit  uint64
	Window time.Duration
	// Windows are every window the run touched, the first and the last
	// partial; Full ones only count below.
	Windows []Window
	// FullWindows counts the full windows, and MaxRatio is the most any
	// of them charged, over the limit.
	FullWindows int
	MaxRatio    float64
	// MaxAdmittedRatio is the most any full window admitted (Admitted),
	// over the limit; MinAdmittedUtilisation the least, over the full
	// windows whose demand exceeded the limit.
	MaxAdmittedRatio, MinAdmittedUtilisation float64
	// DemandWindows counts the full windows whose demand exceeded the
	// limit (Offered > Limit), and MinUtilisation and MeanUtilisation are
	// Charged / Limit over them (0 when there are none).
	DemandWindows                   int
	MinUtilisation, MeanUtilisation float64

	Requests int
	Outcomes [numOutcomes]int // by Outcome
	// FailedOpen counts the streams admitted on a failed request-time
	// call; CutAtEnd those reset because the run ended.
	FailedOpen, CutAtEnd int
}

// Ratio returns what w charged over limit.
func (w Window) Ratio(limit uint64) float64 { return float64(w.Charged) / float64(limit) }

// Count returns how many streams ended with o.
func (r Report) Count(o Outcome) int { return r.Outcomes[o] }

// Measure measures run against a limit of limit tokens per window. The
// windows are aligned to the Unix epoch, as a fixed window's are; a
// stream-done call counts in the window it was sent in, a request-time
// call in the window it was sent in.
func Measure(run Run, limit uint64, window time.Duration) Report {
	rep := Report{Limit: limit, Window: window, Requests: len(run.Results)}
	first := windowOf(run.Began, window)
	byIndex := map[int64]*Window{}
	at := func(t time.Time) *Window {
		k := windowOf(t, window)
		if w := byIndex[k]; w != nil {
			return w
		}
		w := &Window{Start: time.Unix(0, k*int64(window))}
		byIndex[k] = w
		return w
	}
	for _, res := range run.Results {
		rep.Outcomes[res.Outcome]++
		if res.FailedOpen {
			rep.FailedOpen++
		}
		if cut(res) {
			rep.CutAtEnd++
		}
		w := at(res.Asked)
		w.Asked++
		if res.Outcome == Refused {
			w.Refused++
		}
		if res.Stream.Fate == Complete {
			w.Offered += res.Stream.Cost
		}
		if res.StreamDone {
			at(res.Ended).Charged += res.Charged
			w.Admitted += res.Charged
		}
	}
	last := windowOf(run.Ended, window)
	for k := range byIndex {
		last = max(last, k)
	}
	for k := first; k <= last; k++ {
		w := at(time.Unix(0, k*int64(window)))
		w.Full = !w.Start.Before(run.Began) && !w.Start.Add(window).After(run.Ended)
		rep.Windows = append(rep.Windows, *w)
	}
	rep.summarise()
	return rep
}

// summarise fills the report's figures over full windows.
func (r *Report) summarise() {
	var sum float64
	for _, w := range r.Windows {
		if !w.Full {
			continue
		}
		r.FullWindows++
		ratio, admitted := w.Ratio(r.Limit), float64(w.Admitted)/float64(r.Limit)
		r.MaxRatio = max(r.MaxRatio, ratio)
		r.MaxAdmittedRatio = max(r.MaxAdmittedRatio, admitted)
		if w.Offered > r.Limit {
			if r.DemandWindows == 0 || ratio < r.MinUtilisation {
				r.MinUtilisation = ratio
			}
			if r.DemandWindows == 0 || admitted < r.MinAdmittedUtilisation {
				r.MinAdmittedUtilisation = admitted
			}
			r.DemandWindows++
			sum += ratio
		}
	}
	if r.DemandWindows > 0 {
		r.MeanUtilisation = sum / float64(r.DemandWindows)
	}
}

// cut reports whether res was reset by the end of its run rather than by
// its own fate.
func cut(res Result) bool {
	switch res.Outcome {
	case Reset:
		return res.Stream.Fate != ClientReset && res.Stream.Fate != ResetWhileChecking
	case CancelledInFlight:
		return res.Stream.Fate != ResetWhileChecking
	}
	return false
}

// windowOf returns the index of t's epoch-aligned window of length w.
func windowOf(t time.Time, w time.Duration) int64 {
	n := t.UnixNano()
	k := n / int64(w)
	if n%int64(w) < 0 {
		k--
	}
	return k
}

// String returns the report as a table of windows, then its figures.
func (r Report) String() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "window (UTC)\tasked\trefused\toffered\tcharged\tadmitted\tlimit\tratio\tadmitted ratio\tdemand > limit\t")
	for _, w := range r.Windows {
		start := w.Start.UTC().Format("15:04:05")
		if !w.Full {
			start += " (partial)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.2f\t%.2f\t%v\t\n", start, w.Asked, w.Refused, w.Offered, w.Charged, w.Admitted, r.Limit,
			w.Ratio(r.Limit), float64(w.Admitted)/float64(r.Limit), w.Offered > r.Limit)
	}
	tw.Flush()
	fmt.Fprintf(&b, "max ratio over %d full windows of %v: %.3f\n", r.FullWindows, r.Window, r.MaxRatio)
	fmt.Fprintf(&b, "utilisation in the %d full windows whose demand exceeded the limit: min %.3f, mean %.3f\n", r.DemandWindows, r.MinUtilisation, r.MeanUtilisation)
	fmt.Fprintf(&b, "by the window that admitted each stream: max ratio %.3f, min utilisation %.3f\n", r.MaxAdmittedRatio, r.MinAdmittedUtilisation)
	fmt.Fprintf(&b, "%d requests:", r.Requests)
	for o := range numOutcomes {
		fmt.Fprintf(&b, " %v %d;", o, r.Outcomes[o])
	}
	fmt.Fprintf(&b, " failed open %d; cut by the end of the run %d\n", r.FailedOpen, r.CutAtEnd)
	return b.String()
}
