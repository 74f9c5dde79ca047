package s3

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"warmstart/internal/lab/miniotest"
)

// TestUnansweringStoreFailsInTime: a store that accepts connections and
// never answers (a stopped or wedged server) fails a request once its
// response timeout has passed on every retry, naming the timeout, instead
// of holding the verb for minutes.
func TestUnansweringStoreFailsInTime(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	const timeout = 300 * time.Millisecond
	began := time.Now()
	r, err := Open(context.Background(), Options{
		Endpoint: "http://" + ln.Addr().String(), Bucket: "wedged", Region: "us-east-1", AddressingStyle: "path",
		AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheDir: t.TempDir(), CacheMaxBytes: 1 << 20, ResponseTimeout: timeout,
	})
	took := time.Since(began)
	if err == nil {
		r.Close()
		t.Fatal("Open of a store that never answers succeeded")
	}
	// maxRetries+1 attempts and minio-go's backoff between them.
	if limit := (maxRetries+1)*timeout + 10*time.Second; took > limit {
		t.Errorf("Open failed after %v, want within %v: %v", took, limit, err)
	}
	t.Logf("Open failed after %v: %v", took.Round(time.Millisecond), err)
}
