package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"warmstart/internal/daemon"
	"warmstart/internal/miniotest"
	"warmstart/internal/repository/s3"
)

// TestDaemonHoldsTheDeviceOfARemoteRestore: a file-device restore of a
// snapshot in an S3 repository is held by the daemon like a local one: the daemon takes its reference to the device
// generation the restore runs on (whose lower is the remote memory, not a
// local file) instead of failing to attach a local path and logging that
// the restore runs without it.
func TestDaemonHoldsTheDeviceOfARemoteRestore(t *testing.T) {
	srv := miniotest.Start(t)
	ctx := context.Background()
	const bucket = "held"
	if err := srv.MakeBucket(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	repo, err := s3.Open(ctx, s3.Options{
		Endpoint: "http://" + srv.Endpoint, Bucket: bucket, Region: "us-east-1", AddressingStyle: "path",
		AccessKeyID: miniotest.AccessKey, SecretAccessKey: miniotest.SecretKey,
		CacheDir: t.TempDir(), CacheMaxBytes: 256 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { repo.Close() })
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Repository = repo })
	if _, err := r.client.Import(ctx, f.importRequest("remote")); err != nil {
		t.Fatal(err)
	}
	info, err := r.client.Restore(ctx, daemon.RestoreRequest{Snapshot: "remote", Device: "file", Prefetch: "off"})
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Ready["sha256"]; got != f.expected {
		t.Errorf("guest read sha256 %s, want %s", got, f.expected)
	}
	select {
	case <-r.log.logged("restore runs without the daemon's device reference"):
		t.Errorf("the daemon holds no reference to the remote restore's device: %v",
			r.log.attrsOf("restore runs without the daemon's device reference"))
	default:
	}
	// The uffd device serves the remote memory too, through the same
	// node cache; it is the VM's own device, which the daemon counts
	// without holding it.
	uffd, err := r.client.Restore(ctx, daemon.RestoreRequest{Snapshot: "remote", Device: "uffd"})
	if err != nil {
		t.Fatalf("uffd restore of a remote snapshot: %v", err)
	}
	if got := uffd.Ready["sha256"]; got != f.expected {
		t.Errorf("uffd guest read sha256 %s, want %s", got, f.expected)
	}
	// A held generation serves one io_engine: another is bad input naming
	// its field, not a daemon failure.
	direct := 2
	_, err = r.client.Restore(ctx, daemon.RestoreRequest{Snapshot: "remote", Device: "file", IOEngine: &direct})
	var ae *daemon.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Field != "io_engine" {
		t.Errorf("restore on io_engine 2 beside a held generation: %v, want HTTP 409 naming field io_engine", err)
	}
	for _, id := range []string{info.ID, uffd.ID} {
		if _, err := r.client.StopRestore(ctx, id); err != nil {
			t.Fatalf("stop %s: %v", id, err)
		}
	}
}
