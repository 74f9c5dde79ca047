package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"

	"warmstart/internal/api"
)

func TestRecoveredTurnsPanicsInto500(t *testing.T) {
	var logged bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	h := recovered(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/restores", nil))
	var e api.Error
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

// Every request logs one line with its id, method, path, status and
// duration, and the response carries the same id.
func TestEveryRequestLogsOneLineWithItsID(t *testing.T) {
	var out bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&out, nil))
	h := logged(log, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) }))
	ids := map[string]bool{}
	for _, method := range []string{http.MethodGet, http.MethodPost} {
		out.Reset()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, "/restores/x", nil))
		var line struct {
			Msg       string  `json:"msg"`
			RequestID string  `json:"request_id"`
			Method    string  `json:"method"`
			Path      string  `json:"path"`
			Status    int     `json:"status"`
			Duration  float64 `json:"duration"`
		}
		if err := json.Unmarshal(out.Bytes(), &line); err != nil || strings.Count(out.String(), "\n") != 1 {
			t.Fatalf("%s logged %q (%v), want one JSON line", method, out.String(), err)
		}
		id := rec.Header().Get(requestIDHeader)
		if line.Msg != "request" || line.RequestID != id || len(id) != 16 || line.Method != method ||
			line.Path != "/restores/x" || line.Status != http.StatusTeapot || line.Duration <= 0 {
			t.Errorf("%s: line %+v, response id %q", method, line, id)
		}
		ids[id] = true
	}
	if len(ids) != 2 {
		t.Errorf("two requests got ids %v", ids)
	}
}

// A body that cannot be read to its end after one JSON object (it is
// shorter than its Content-Length, so the read times out) is refused as
// unreadable; only a body that goes on past the object holds more than
// one value.
func TestDecodeJSONNamesWhatFollowsTheObject(t *testing.T) {
	timeout := errors.New("read tcp: i/o timeout")
	for _, c := range []struct {
		body io.Reader
		want string
	}{
		{io.MultiReader(strings.NewReader(`{"snapshot":"a"}`), iotest.ErrReader(timeout)), "read the request body: read tcp: i/o timeout"},
		{strings.NewReader(`{"snapshot":"a"} {}`), "request body holds more than one JSON value"},
		{strings.NewReader(`{"snapshot":"a"} x`), "request body holds more than one JSON value"},
		{strings.NewReader(`{"snapshot":"a"} {"a"`), "request body holds more than one JSON value"},
		{io.MultiReader(strings.NewReader(`{"snapshot":"a"}`), iotest.ErrReader(io.ErrUnexpectedEOF)), "read the request body: unexpected EOF"},
	} {
		var req api.RestoreRequest
		r := httptest.NewRequest(http.MethodPost, "/restores", c.body)
		err := decodeJSON(httptest.NewRecorder(), r, &req)
		var ae *apiError
		if !errors.As(err, &ae) || ae.status != http.StatusBadRequest || ae.err.Error() != c.want {
			t.Errorf("decodeJSON = %v, want a 400 %q", err, c.want)
		}
	}
}
