package s3

import (
	"context"
	"errors"
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
