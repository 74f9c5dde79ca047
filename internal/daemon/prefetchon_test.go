package daemon_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	"warmstart/internal/api"
)

// A restore asking to prefetch (on) a snapshot without a manifest is a 409
// on prefetch whose message names the request's fields, not the CLI's
// flags: the client sent JSON.
func TestPrefetchOnWithoutAManifestNamesTheRequestField(t *testing.T) {
	f := newFixture(t, fixtureOptions{})
	r := startDaemon(t, f, nil)
	ctx := context.Background()
	if _, err := r.client.Import(ctx, f.importRequest("bare")); err != nil {
		t.Fatal(err)
	}
	_, err := r.client.Restore(ctx, api.RestoreRequest{Snapshot: "bare", Prefetch: "on"})
	var ae *api.APIError
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusConflict || ae.Field != "prefetch" ||
		!strings.HasPrefix(ae.Message, `prefetch "on": snapshot bare has no startup manifest`) ||
		!strings.Contains(ae.Message, `prefetch "auto" or "off"`) || strings.Contains(ae.Message, "--") {
		t.Fatalf("restore with prefetch on and no manifest = %v, want a 409 on prefetch naming request fields", err)
	}
}
