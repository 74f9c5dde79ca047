package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository"
)

// A request the store gives no answer to (nobody listens, no response
// within the timeout, the response stops coming) fails with repository.ErrUnreachable; an answer, even an
// error status, and a request its caller cancelled do not.
func TestTransportSaysWhenTheStoreGaveNoAnswer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String() + "/"
	l.Close() // nobody listens there any more
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/silent" {
			<-release // no headers, connection open
			return
		}
		if r.URL.Path == "/stalls" {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
			return
		}
		http.Error(w, "denied", http.StatusForbidden)
	}))
	defer srv.Close()
	defer close(release)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.ResponseHeaderTimeout = 200 * time.Millisecond
	client := &http.Client{Transport: &stallTransport{next: tr, idle: 200 * time.Millisecond}}

	if _, err := client.Get(refused); !errors.Is(err, repository.ErrUnreachable) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a refused connection: %v; want ErrUnreachable wrapping ECONNREFUSED", err)
	}
	if _, err := client.Get(srv.URL + "/silent"); !errors.Is(err, repository.ErrUnreachable) {
		t.Errorf("no response headers within the timeout: %v; want ErrUnreachable", err)
	}
	resp, err := client.Get(srv.URL + "/denied")
	if err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a 403 answer: %v, %v", resp, err)
	}
	resp.Body.Close()
	resp, err = client.Get(srv.URL + "/stalls")
	if err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !errors.Is(err, repository.ErrUnreachable) || !errors.Is(err, ErrStalled) {
		t.Errorf("a stalled body: %v; want ErrUnreachable and ErrStalled", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, refused, nil)
	if _, err := client.Do(req); err == nil || errors.Is(err, repository.ErrUnreachable) {
		t.Errorf("a request its caller cancelled: %v; want an error that is not ErrUnreachable", err)
	}
}

// Through minio-go and the repository: a store that answers "no such
// snapshot" is ErrNotFound, not unreachable; once its server is stopped
// the same lookup is ErrUnreachable.
func TestRepositorySaysWhenTheStoreIsUnreachable(t *testing.T) {
	srv := miniotest.Start(t)
	const bucket = "unreachable"
	if err := srv.MakeBucket(context.Background(), bucket); err != nil {
		t.Fatal(err)
	}
	o := testOptions(t, srv.Endpoint)
	o.Bucket = bucket
	repo := openWith(t, o)
	const id = "01a25217-71f4-7f3f-8015-c8002af1a10f"
	_, err := repo.Resolve(bg(), id)
	if !errors.Is(err, repository.ErrNotFound) || errors.Is(err, repository.ErrUnreachable) {
		t.Fatalf("resolve of a missing snapshot: %v; want ErrNotFound only", err)
	}
	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	_, err = repo.Resolve(bg(), id)
	if !errors.Is(err, repository.ErrUnreachable) || errors.Is(err, repository.ErrNotFound) {
		t.Fatalf("resolve with the server stopped: %v; want ErrUnreachable", err)
	}
}

// A response whose connection closes or is reset before its body ends
// (the store crashed or restarted mid-GET) is a response that stopped
// coming: ErrUnreachable, as a stalled one is, and still the read's own
// error. A body read to its end is not.
func TestBodyCutShortIsUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reset := make(chan struct{})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go serveCut(c, reset)
		}
	}()
	client := &http.Client{Transport: &stallTransport{next: http.DefaultTransport.(*http.Transport).Clone(), idle: time.Minute}}
	base := "http://" + l.Addr().String()
	for _, c := range []struct {
		path  string
		cause error
	}{{"/closed", io.ErrUnexpectedEOF}, {"/reset", syscall.ECONNRESET}} {
		resp, err := client.Get(base + c.path)
		if err != nil {
			t.Fatalf("%s: %v", c.path, err)
		}
		if c.path == "/reset" {
			close(reset) // the headers are in: reset the connection now
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if !errors.Is(err, repository.ErrUnreachable) || !errors.Is(err, c.cause) {
			t.Errorf("a body cut short (%s): %v; want ErrUnreachable wrapping %v", c.path, err, c.cause)
		}
	}
	resp, err := client.Get(base + "/whole")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil || n != 100 {
		t.Errorf("a whole body: %d bytes, %v; want 100, nil", n, err)
	}
}

// serveCut answers one request on c with headers promising 100 bytes: all
// of them for /whole; 10 and then the connection closed for /closed; 10
// and, once reset is closed, the connection reset for /reset.
func serveCut(c net.Conn, reset <-chan struct{}) {
	defer c.Close()
	buf := make([]byte, 4096)
	n, _ := c.Read(buf)
	req := buf[:n]
	body := 10
	if bytes.Contains(req, []byte("GET /whole ")) {
		body = 100
	}
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nConnection: close\r\n\r\n%s", make([]byte, body))
	if bytes.Contains(req, []byte("GET /reset ")) {
		<-reset
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // Close sends RST
		}
	}
}
