package refstats

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// maxDatagram is the most bytes of statsd lines sent in one UDP datagram:
// what fits an Ethernet MTU of 1500 with the IPv6 and UDP headers.
const maxDatagram = 1432

// StatsdOptions configure [NewStatsd].
type StatsdOptions struct {
	// Addr is the statsd server's UDP address, host:port. Required.
	Addr string
	// Tags are added to every stat: as DogStatsD tags (|#k:v,…) with
	// DogStatsD, else into the name as the reference's statsd library
	// writes them (name.__k=v, keys sorted).
	Tags map[string]string
	// DogStatsD selects the DogStatsD dialect.
	DogStatsD bool
	// Logger receives a warning when sending fails, at most once a
	// minute. Default: discard.
	Logger *slog.Logger
	// Now tells when the last warning was. Default time.Now.
	Now func() time.Time
}

// StatsdSink sends flushes to a statsd server over UDP. Create it with
// [NewStatsd]; Close it when done.
type StatsdSink struct {
	addr     string
	suffix   string // tags in the name: .__k=v…
	dogTags  string // |#k:v,…
	log      *slog.Logger
	now      func() time.Time
	mu       sync.Mutex // guards conn and lastWarn
	conn     net.Conn
	lastWarn time.Time
	errs     atomic.Uint64
	buf      []byte
}

var _ Sink = (*StatsdSink)(nil)

// NewStatsd returns a sink sending to opts.Addr. The address is resolved
// when a flush first sends, and again after a failure: a statsd server
// not yet up at start is not an error.
func NewStatsd(opts StatsdOptions) (*StatsdSink, error) {
	if _, _, err := net.SplitHostPort(opts.Addr); err != nil {
		return nil, fmt.Errorf("statsd address %q: %w", opts.Addr, err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &StatsdSink{addr: opts.Addr, log: opts.Logger, now: opts.Now}
	keys := make([]string, 0, len(opts.Tags))
	for k := range opts.Tags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var suffix, dog strings.Builder
	for _, k := range keys {
		v := opts.Tags[k]
		if opts.DogStatsD {
			if dog.Len() == 0 {
				dog.WriteString("|#")
			} else {
				dog.WriteByte(',')
			}
			dog.WriteString(cleanTag(k) + ":" + cleanTag(v))
		} else {
			suffix.WriteString(".__" + Sanitize(k) + "=" + Sanitize(v))
		}
	}
	s.suffix, s.dogTags = suffix.String(), dog.String()
	return s, nil
}

// cleanTag makes a DogStatsD tag part safe: ',' and '|' end a tag, ':'
// ends its name, line breaks end the line.
func cleanTag(s string) string {
	return strings.NewReplacer(",", "_", "|", "_", ":", "_", "\n", "_", "\r", "_").Replace(s)
}

// Errors returns how many datagrams could not be sent.
func (s *StatsdSink) Errors() uint64 { return s.errs.Load() }

// Flush sends samples as statsd lines, packed into datagrams.
func (s *StatsdSink) Flush(samples []Sample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buf[:0]
	for i := range samples {
		line := s.appendLine(nil, &samples[i])
		if len(b) > 0 && len(b)+len(line) > maxDatagram {
			s.send(b)
			b = b[:0]
		}
		b = append(b, line...)
	}
	if len(b) > 0 {
		s.send(b)
	}
	s.buf = b[:0]
}

// appendLine appends sample x's statsd line, newline-terminated.
func (s *StatsdSink) appendLine(b []byte, x *Sample) []byte {
	b = append(append(b, x.Name...), s.suffix...)
	b = append(b, ':')
	if x.Value == float64(uint64(x.Value)) {
		b = strconv.AppendUint(b, uint64(x.Value), 10)
	} else {
		b = strconv.AppendFloat(b, x.Value, 'f', -1, 64)
	}
	switch x.Kind {
	case Timer:
		b = append(b, "|ms"...)
		if x.Rate > 0 && x.Rate < 1 {
			b = append(b, "|@"...)
			b = strconv.AppendFloat(b, x.Rate, 'f', -1, 64)
		}
	default:
		b = append(b, "|c"...)
	}
	b = append(b, s.dogTags...)
	return append(b, '\n')
}

// send writes one datagram, dialing first when not connected.
func (s *StatsdSink) send(b []byte) {
	if s.conn == nil {
		c, err := net.Dial("udp", s.addr)
		if err != nil {
			s.fail(err)
			return
		}
		s.conn = c
	}
	if _, err := s.conn.Write(b); err != nil {
		s.conn.Close()
		s.conn = nil
		s.fail(err)
	}
}

// fail counts a datagram not sent and warns at most once a minute.
func (s *StatsdSink) fail(err error) {
	s.errs.Add(1)
	if now := s.now(); now.Sub(s.lastWarn) >= time.Minute {
		s.lastWarn = now
		s.log.Warn("statsd: stats not sent", "addr", s.addr, "error", err, "failed_total", s.errs.Load())
	}
}

// Close closes the connection.
func (s *StatsdSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		return nil
	}
	err := s.conn.Close()
	s.conn = nil
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
