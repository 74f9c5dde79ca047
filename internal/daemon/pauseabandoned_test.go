package daemon_test

import (
	"context"
	"testing"

	"warmstart/internal/api"
	"warmstart/internal/daemon"
	"warmstart/internal/pause"
)

// TestAbandonedPauseCarriesItsAlias: a then=resume pause whose client
// goes away mid-pause (at each step from the freeze on) completes as
// asked: the guest's state is captured, so the child is published, and
// under the alias the client asked for, not without it.
func TestAbandonedPauseCarriesItsAlias(t *testing.T) {
	for _, step := range []string{pause.StepPause, pause.StepLayer, pause.StepManifest, pause.StepPublish} {
		t.Run(step, func(t *testing.T) {
			held, ended := make(chan struct{}), make(chan struct{})
			release := make(chan struct{})
			daemon.SetPauseStepHook(t, func(ctx context.Context, _, s string) {
				switch s {
				case step:
					close(held)
					select {
					case <-release:
					case <-ctx.Done():
					}
				case pause.StepEnd:
					close(ended)
				}
			})
			f := newFixture(t, fixtureOptions{})
			r, imp, in := pausableRestore(t, f, nil)
			ctx, cancel := context.WithCancel(context.Background())
			out := make(chan error, 1)
			go func() {
				_, err := r.client.Pause(ctx, in.ID, api.PauseRequest{Alias: "kid", Then: api.ThenResume})
				out <- err
			}()
			<-held
			cancel()
			if err := <-out; err == nil {
				t.Fatal("a pause whose client went away answered")
			}
			close(release)
			<-ended
			bg := context.Background()
			kid, err := r.client.Snapshot(bg, "kid")
			if err != nil {
				t.Fatalf("the abandoned pause's child under its alias: %v", err)
			}
			if kid.Record.Alias != "kid" || kid.Record.Parent != imp.ID {
				t.Fatalf("the abandoned pause's child: alias %q, parent %q; want kid, %s", kid.Record.Alias, kid.Record.Parent, imp.ID)
			}
			if _, err := r.client.StopRestore(bg, in.ID); err != nil {
				t.Fatal(err)
			}
		})
	}
}
