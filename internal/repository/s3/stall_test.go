package s3

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// A response whose body stops after its headers and a few bytes ends the
// read with ErrStalled once the read has waited the idle time, instead of
// holding the reader for ever; a reader that takes its time between reads
// of a body that keeps coming is never cut off.
func TestStalledBodyEndsTheRead(t *testing.T) {
	const body = 64 << 10
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(body))
		w.WriteHeader(http.StatusOK)
		if r.URL.Path == "/stalls" {
			w.Write(make([]byte, 100))
			w.(http.Flusher).Flush()
			<-release // the store stops sending, connection open
			return
		}
		w.Write(make([]byte, body))
	}))
	defer srv.Close()
	defer close(release)
	const idle = 200 * time.Millisecond
	client := &http.Client{Transport: &stallTransport{next: http.DefaultTransport.(*http.Transport).Clone(), idle: idle}}

	resp, err := client.Get(srv.URL + "/stalls")
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if !errors.Is(err, ErrStalled) || n != 100 {
		t.Fatalf("read %d bytes, %v; want the 100 sent and ErrStalled", n, err)
	}
	if took := time.Since(began); took > idle+5*time.Second {
		t.Errorf("the stalled read ended after %v, want about %v", took, idle)
	}

	resp, err = client.Get(srv.URL + "/steady")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 16<<10)
	total := 0
	for {
		n, err := resp.Body.Read(buf)
		total += n
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("a slow reader of a steady body was cut off after %d bytes: %v", total, err)
		}
		time.Sleep(2 * idle) // a consumer slower than the idle time, on purpose
	}
	if total != body {
		t.Fatalf("read %d bytes, want %d", total, body)
	}
}
