package miniotest

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"warmstart/internal/ratelimit"
)

// Link is a node's network link to the object store: a TCP forwarder on
// loopback whose server-to-client bytes, summed over every connection
// through it, are held to one rate. Toxiproxy's bandwidth toxic limits
// each connection on its own, so a client opening more connections would
// get more bandwidth than a node's link has; chained in front of the
// Toxiproxy (client → Link → Proxy → MinIO), the Link caps the sum.
type Link struct {
	// Addr is host:port clients connect to.
	Addr string

	upstream string
	ln       net.Listener
	limit    *ratelimit.Limiter
	ctx      context.Context
	cancel   context.CancelFunc

	mu    sync.Mutex
	conns map[net.Conn]bool
	wg    sync.WaitGroup
}

// linkSliceBytes is the unit the link meters: small enough that
// connections share the rate fairly, large enough to keep copies cheap.
const linkSliceBytes = 16 << 10

// linkSlack is how much of the link's time a forwarder that was not
// running may make up for: the limiter's bucket. A real link keeps
// delivering into the receiver's socket buffers while the receiving
// process waits for a core; a forwarder goroutine that wakes late (the
// benchmark shares 2 cores between MinIO, the node and the guest) would
// otherwise lose that time for good. With a burst of 4 slices (0.5 ms at
// 1 Gbit/s) four connections got 830-860 Mbit/s of a 1000 Mbit/s link on
// an idle host and 780-800 under load; with 5 ms, 990-1006 in both. Over
// any interval T the link still delivers at most rate × (T + linkSlack).
const linkSlack = 5 * time.Millisecond

// NewLink starts a link on a free port of 127.0.0.1 forwarding to
// upstream, unlimited until SetRate. Close it when done.
func NewLink(upstream string) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("link to %s: %w", upstream, err)
	}
	l := &Link{Addr: ln.Addr().String(), upstream: upstream, ln: ln,
		limit: ratelimit.New(rate.Inf, linkSliceBytes), conns: map[net.Conn]bool{}}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Go(l.accept)
	return l, nil
}

// SetRate caps the link's server-to-client bytes at bitsPerSecond in all;
// zero or less removes the cap.
func (l *Link) SetRate(bitsPerSecond int64) {
	if bitsPerSecond <= 0 {
		l.limit.Set(rate.Inf, linkSliceBytes)
		return
	}
	bytesPerSec := float64(bitsPerSecond) / 8
	l.limit.Set(rate.Limit(bytesPerSec), max(4*linkSliceBytes, int(bytesPerSec*linkSlack.Seconds())))
}

// Close stops accepting, closes every connection and waits for the copies.
func (l *Link) Close() {
	l.cancel()
	l.ln.Close()
	l.mu.Lock()
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *Link) track(c net.Conn, on bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on && l.ctx.Err() != nil {
		return false
	}
	if on {
		l.conns[c] = true
	} else {
		delete(l.conns, c)
	}
	return true
}

func (l *Link) accept() {
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.wg.Go(func() { l.serve(client) })
	}
}

// serve forwards one connection: client bytes as they come, server bytes
// through the shared limiter.
func (l *Link) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", l.upstream)
	if err != nil {
		return
	}
	defer server.Close()
	if !l.track(client, true) || !l.track(server, true) {
		return
	}
	defer l.track(client, false)
	defer l.track(server, false)
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(server, client)
		server.(*net.TCPConn).CloseWrite()
	}()
	l.copyLimited(client, server)
	client.(*net.TCPConn).CloseWrite()
	<-done
}

func (l *Link) copyLimited(dst io.Writer, src io.Reader) {
	buf := make([]byte, linkSliceBytes)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if werr := l.limit.Wait(l.ctx, n); werr != nil {
				return // closed
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
