package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/lab/miniotest"
	"warmstart/internal/repository/s3"
)

// TestDaemonHoldsTheDeviceOfARemoteRestore: a file-device restore of a
// snapshot in an S3 repository is held by the daemon like a local one: the daemon takes its reference to the device
// generation the restore runs on (whose lower is the remote memory, not a
// local file) instead of failing to attach a local path and logging that
// the restore runs without it.
func TestDaemonHoldsTheDeviceOfARemoteRestore(t *testing.T) {
	ctx := context.Background()
	f, r := s3Daemon(t, "held", false)
	info, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "remote", Device: "file", Prefetch: "off"})
	if err != nil {
		t.Fatal(err)
	}
	if got := info.Ready.SHA256; got != f.expected {
		t.Errorf("guest read sha256 %s, want %s", got, f.expected)
	}
	select {
	case <-r.log.logged("restore runs without the daemon's device reference"):
		t.Errorf("the daemon holds no reference to the remote restore's device: %v",
			r.log.attrsOf("restore runs without the daemon's device reference"))
	default:
	}
	// A held generation serves one io_engine: another is bad input naming
	// its field, not a daemon failure.
	direct := 2
	_, err = r.client.Restore(ctx, api.RestoreRequest{Snapshot: "remote", Device: "file", IOEngine: &direct})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Field != "io_engine" {
		t.Errorf("restore on io_engine 2 beside a held generation: %v, want HTTP 409 naming field io_engine", err)
	}
	if _, err := r.client.StopRestore(ctx, info.ID); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// TestDaemonRestoresS3SnapshotsOnUffd: the uffd device serves an S3
// snapshot's memory too, through the same node cache, prefetching its
// recorded manifest or not; it is the VM's own device, which the daemon
// counts without holding it.
func TestDaemonRestoresS3SnapshotsOnUffd(t *testing.T) {
	ctx := context.Background()
	f, r := s3Daemon(t, "uffd", true)
	for _, prefetch := range []string{"off", "on"} {
		info, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "remote", Device: "uffd", Prefetch: prefetch})
		if err != nil {
			t.Fatalf("uffd restore of a remote snapshot, prefetch %s: %v", prefetch, err)
		}
		if got := info.Ready.SHA256; got != f.expected {
			t.Errorf("prefetch %s: guest read sha256 %s, want %s", prefetch, got, f.expected)
		}
		if info.Device != "uffd" || info.DeviceBytes.BytesRead == 0 {
			t.Errorf("prefetch %s: device %q read %d bytes; want the uffd device reading the memory", prefetch, info.Device, info.DeviceBytes.BytesRead)
		}
		if skipped := info.Prefetch.State == "skipped"; skipped != (prefetch == "off") {
			t.Errorf("prefetch %s: prefetch %s (%s)", prefetch, info.Prefetch.State, info.Prefetch.Reason)
		}
		if _, err := r.client.StopRestore(ctx, info.ID); err != nil {
			t.Fatalf("stop: %v", err)
		}
	}
}

// s3Daemon serves a daemon on a fresh MinIO bucket of its own, with the
// fixture's reference imported as "remote" and, with record, its startup
// manifest recorded.
func s3Daemon(t *testing.T, bucket string, record bool) (*fixture, *running) {
	t.Helper()
	srv := miniotest.Start(t)
	ctx := context.Background()
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
	f := newFixture(t, fixtureOptions{recordOnPublish: record})
	r := startDaemon(t, f, func(o *daemon.Options) { o.Repository = repo })
	attached := r.log.logged("startup manifest attached")
	r.importAs(t, f, "remote")
	if record {
		<-attached
	}
	return f, r
}
