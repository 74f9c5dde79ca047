package daemon

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRecoveredTurnsPanicsInto500(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	h := recovered(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/restores", nil))
	var e Error
	if rec.Code != http.StatusInternalServerError || json.Unmarshal(rec.Body.Bytes(), &e) != nil || e.Error == "" {
		t.Fatalf("panicking handler answered %d %q", rec.Code, rec.Body)
	}
	if out := logged.String(); !strings.Contains(out, "handler panic") || !strings.Contains(out, "boom") || !strings.Contains(out, "goroutine") {
		t.Errorf("log %q lacks the panic and its stack", out)
	}

	// A handler that already answered keeps its answer.
	h = recovered(log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		panic("late")
	}))
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusCreated || rec.Body.Len() != 0 {
		t.Errorf("late panic rewrote the answer: %d %q", rec.Code, rec.Body)
	}

	// http.ErrAbortHandler keeps its meaning: abort the connection.
	h = recovered(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	defer func() {
		if p := recover(); p != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler passed on", p)
		}
	}()
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, "/", nil))
}
