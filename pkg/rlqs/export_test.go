package rlqs

// Quiescence reads, for tests, what the server's open streams took and
// sent, and its work in progress (Server.work), in the order a waiter
// needs: streams, how many are open; received, the reports their
// goroutines took; work, what may still send a response (read after
// received: a report is counted in work before it is in received); sent,
// the responses those streams sent, answers and pushes. Once the open
// streams are those of the clients, received covers every report they
// sent and work is 0, no response is on its way but the sent ones, until
// a client reports, the clock moves or a stream ends.
func (s *Server) Quiescence() (streams int, received uint64, work int64, sent uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ss := range s.open {
		received += ss.received.Load()
	}
	work = s.work.Load()
	for _, ss := range s.open {
		sent += ss.responded.Load()
	}
	return len(s.open), received, work, sent
}
