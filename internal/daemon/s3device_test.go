package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/miniotest"
	"warmstart/internal/repository/s3"
)

// A file-device restore of a snapshot in an S3 repository is held by the
// daemon like a local one: the daemon takes its reference to the device
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
	info, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "remote", Device: "file", Prefetch: "off"})
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
	// What cannot be restored so is bad input naming its field, not a
	// daemon failure: the uffd device needs a local memory file, and a
	// held generation serves one io_engine.
	direct := 2
	for _, c := range []struct {
		req    api.RestoreRequest
		status int
		field  string
	}{
		{api.RestoreRequest{Snapshot: "remote", Device: "uffd"}, http.StatusBadRequest, "device"},
		{api.RestoreRequest{Snapshot: "remote", Device: "file", IOEngine: &direct}, http.StatusConflict, "io_engine"},
	} {
		_, err := r.client.Restore(ctx, c.req)
		var ae *api.APIError
		if !errors.As(err, &ae) || ae.StatusCode != c.status || ae.Field != c.field {
			t.Errorf("restore %+v: %v, want HTTP %d naming field %s", c.req, err, c.status, c.field)
		}
	}
	if _, err := r.client.StopRestore(ctx, info.ID); err != nil {
		t.Fatalf("stop: %v", err)
	}
}
