package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"warmstart/internal/api"
)

// maxRequestBytes bounds a request body; every request is a small JSON object.
const maxRequestBytes = 1 << 20

// fieldBody names the request body as a whole in errors about it.
const fieldBody = "body"

// apiError is an error with the HTTP status and the request field it is
// about; handlers return it for everything the caller got wrong.
type apiError struct {
	status int
	field  string
	err    error
	// retryAfter, when set, is sent as Retry-After (whole seconds).
	retryAfter time.Duration
}

func (e *apiError) Error() string { return e.err.Error() }
func (e *apiError) Unwrap() error { return e.err }

func badRequest(field, format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, field: field, err: fmt.Errorf(format, args...)}
}

func statusError(status int, field string, err error) error {
	return &apiError{status: status, field: field, err: err}
}

// handlerFunc is a handler that reports failure by returning it.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// serve adapts h: an *apiError becomes its status with a JSON body naming
// the field; a full disk is a 507 and an unreachable store a 503 with
// Retry-After (unavailableError); any other error is a 500 and is logged,
// because it is ours, unless the client went away, which cut the work
// short (a 499 nobody reads).
func (d *Daemon) serve(h handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := h(w, r)
		if err == nil {
			return
		}
		var ae *apiError
		switch {
		case errors.As(err, &ae):
		case d.clientGone(r.Context()):
			d.log.Info("request abandoned by its client", "method", r.Method, "path", r.URL.Path, "err", err)
			ae = &apiError{status: statusClientClosedRequest, err: err}
		case unavailableError(err) != nil:
			ae = unavailableError(err)
			d.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "status", ae.status, "err", err)
		default:
			d.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			ae = &apiError{status: http.StatusInternalServerError, err: err}
		}
		if ae.retryAfter > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((ae.retryAfter+time.Second-1)/time.Second)))
		}
		writeJSON(w, ae.status, api.Error{Error: bounded(ae.err.Error(), maxEchoBytes), Field: bounded(ae.field, maxFieldEchoBytes)})
	})
}

// retryUnreachable is the Retry-After of a 503 for an unreachable store:
// long enough for a restarted store to listen again, short next to the
// time a client gives a pause or a restore.
const retryUnreachable = 5 * time.Second

// unavailableError is the answer to a request that failed for want of a
// resource rather than through the client or a bug of ours
// (api.UnavailableStatus, which the CLI's exit status follows too): 507
// when a disk (the staging directory, the store, the node cache) had no
// space left or was read-only, 503 with Retry-After when the store gave no
// answer. nil for any other error.
func unavailableError(err error) *apiError {
	switch api.UnavailableStatus(err) {
	case http.StatusInsufficientStorage:
		return &apiError{status: http.StatusInsufficientStorage, err: err}
	case http.StatusServiceUnavailable:
		return &apiError{status: http.StatusServiceUnavailable, err: err, retryAfter: retryUnreachable}
	}
	return nil
}

// retryShuttingDown is the Retry-After of a request the shutdown refused
// or cut short: about the time a restarted daemon takes to serve again.
const retryShuttingDown = 5 * time.Second

// shuttingDown is the answer to a request refused or cancelled because
// the daemon is shutting down: 503 with Retry-After, saying so, and
// err, when not nil, saying what became of the request.
func shuttingDown(err error) error {
	if err != nil {
		err = fmt.Errorf("%w: %w", ErrShuttingDown, err)
	} else {
		err = ErrShuttingDown
	}
	return &apiError{status: http.StatusServiceUnavailable, err: err, retryAfter: retryShuttingDown}
}

// clientGone reports whether a request's context ended because its client
// went away, not because the daemon is shutting down.
func (d *Daemon) clientGone(ctx context.Context) bool {
	return ctx.Err() != nil && d.reqCtx.Err() == nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// The status is sent; a failure here is the client going away.
	_ = enc.Encode(v)
}

// decodeJSON reads the request body as exactly one JSON object into v,
// refusing unknown fields, so that a misspelt option is an error rather than
// silently ignored. Keys must be v's field names exactly (checkKeys):
// encoding/json would match "SNAPSHOT" to snapshot, and take the last of
// a key given twice.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body := &readRecorder{r: http.MaxBytesReader(w, r.Body, maxRequestBytes)}
	dec := json.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return jsonError(err)
	}
	if err := checkKeys(raw, v); err != nil {
		return err
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		return jsonError(err)
	}
	var extra json.RawMessage
	err := dec.Decode(&extra)
	switch {
	case errors.Is(err, io.EOF):
		return nil
	case body.err == nil:
		// All of it was read, and more than one value (whole or cut
		// short) was in it.
		return badRequest(fieldBody, "request body holds more than one JSON value")
	}
	// The body grew too long, ended early or timed out after the object.
	if tooLong := (*http.MaxBytesError)(nil); errors.As(body.err, &tooLong) {
		return jsonError(body.err)
	}
	return badRequest(fieldBody, "read the request body: %v", body.err)
}

// checkKeys refuses a body that is not a JSON object (null included: it
// would decode as an empty request), and an object with a key that is not
// exactly the JSON name of one of v's fields, or that it gives twice, naming
// that key. A value of the wrong type is left to the decoder.
func checkKeys(raw json.RawMessage, v any) error {
	if kind := jsonKind(raw); kind != "object" {
		return badRequest(fieldBody, "request body is JSON %s; want an object", kind)
	}
	names := jsonNames(reflect.TypeOf(v).Elem())
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil { // '{': raw is one whole object
		return jsonError(err)
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return jsonError(err)
		}
		key := tok.(string) // an object's keys are strings
		switch {
		case seen[key]:
			return badRequest(key, "field %q is given twice", key)
		case !names[key]:
			return unknownField(key, names)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return jsonError(err)
		}
	}
	return nil
}

// unknownField is the error for key, which names none of the fields in
// names; one that differs only in case says which it is not.
func unknownField(key string, names map[string]bool) error {
	for name := range names {
		if strings.EqualFold(name, key) {
			return badRequest(key, "unknown field %q (field names are case-sensitive: %q)", key, name)
		}
	}
	return badRequest(key, "unknown field %q", key)
}

// jsonKind names the kind of JSON value raw holds (one whole value).
func jsonKind(raw json.RawMessage) string {
	switch b := bytes.TrimLeft(raw, " \t\r\n"); {
	case len(b) == 0:
		return "empty"
	case b[0] == '{':
		return "object"
	case b[0] == '[':
		return "array"
	case b[0] == '"':
		return "string"
	case b[0] == 'n':
		return "null"
	case b[0] == 't', b[0] == 'f':
		return "bool"
	}
	return "number"
}

// jsonNames is the set of JSON names of struct type t's fields, as
// encoding/json names them (the fields of embedded structs included).
func jsonNames(t reflect.Type) map[string]bool {
	names := make(map[string]bool)
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct:
			maps.Copy(names, jsonNames(f.Type))
		case tag != "":
			names[tag] = true
		default:
			names[f.Name] = true
		}
	}
	return names
}

// readRecorder remembers the first error its reader returned other than
// EOF: a decoder reports a body cut short and a truncated JSON value with
// the same error, and only the reader knows which it was.
type readRecorder struct {
	r   io.Reader
	err error
}

func (rr *readRecorder) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if err != nil && err != io.EOF && rr.err == nil {
		rr.err = err
	}
	return n, err
}

// decodeOptionalJSON is decodeJSON for a body that may be left out: an
// empty body leaves v as it is.
func decodeOptionalJSON(w http.ResponseWriter, r *http.Request, v any) error {
	data, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxRequestBytes))
	if err != nil {
		return jsonError(err)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	return decodeJSON(w, r, v)
}

// jsonError names what is wrong with a request body, and the field when
// the problem is one field.
func jsonError(err error) error {
	var (
		syntax  *json.SyntaxError
		typ     *json.UnmarshalTypeError
		tooLong *http.MaxBytesError
	)
	switch {
	case errors.Is(err, io.EOF):
		return badRequest(fieldBody, "empty request body; want a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest(fieldBody, "malformed JSON: unexpected end of the body")
	case errors.As(err, &syntax):
		return badRequest(fieldBody, "malformed JSON at byte %d: %v", syntax.Offset, err)
	case errors.As(err, &typ) && typ.Field != "":
		return badRequest(typ.Field, "field %s: JSON %s where %s is wanted", typ.Field, typ.Value, typ.Type)
	case errors.As(err, &typ):
		return badRequest(fieldBody, "request body is JSON %s; want an object", typ.Value)
	case errors.As(err, &tooLong):
		return statusError(http.StatusRequestEntityTooLarge, fieldBody, fmt.Errorf("request body is larger than %d bytes", tooLong.Limit))
	}
	// encoding/json has no typed error for DisallowUnknownFields.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return badRequest(name, "unknown field %q", name)
	}
	return badRequest(fieldBody, "malformed JSON: %v", err)
}

// statusWriter remembers the status a handler sent.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// routed answers requests no pattern of mux matches with a JSON 404, or a
// JSON 405 naming the allowed methods, instead of ServeMux's plain text.
func routed(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		var allowed []string
		for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
			probe := r.Clone(r.Context())
			probe.Method = m
			if _, pattern := mux.Handler(probe); pattern != "" {
				allowed = append(allowed, m)
			}
		}
		if len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			writeJSON(w, http.StatusMethodNotAllowed, api.Error{
				Error: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", r.Method, r.URL.Path, strings.Join(allowed, ", ")),
				Field: "method",
			})
			return
		}
		writeJSON(w, http.StatusNotFound, api.Error{Error: fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path), Field: "path"})
	})
}

// recovered turns a handler panic into a logged 500, the last resort that
// keeps one bad request from taking every running VM down with the daemon.
func recovered(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			p := recover()
			if p == nil {
				return
			}
			if p == http.ErrAbortHandler {
				panic(p)
			}
			log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			if sw.status == 0 {
				writeJSON(sw, http.StatusInternalServerError, api.Error{Error: "internal error; see the daemon's log"})
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// logged logs each request once it is answered, in one line at Info with
// a request id, which the response carries too (X-Request-Id) so that a
// client's report can be matched with the daemon's log.
func logged(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := newRequestID()
		w.Header().Set(requestIDHeader, id)
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		log.Info("request", "request_id", id, "method", r.Method, "path", r.URL.Path, "status", sw.status,
			"duration", time.Since(start))
	})
}

// requestIDHeader carries a request's id in the response.
const requestIDHeader = "X-Request-Id"

// newRequestID returns 16 random hex digits: unique enough to find one
// request in a day of logs, short enough to read.
func newRequestID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// inflight counts requests being handled, so shutdown can wait for them
// and refuse any that arrive on a connection accepted before it began.
type inflight struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{} // closed once closed is set and n is 0
}

func newInflight() *inflight { return &inflight{idle: make(chan struct{})} }

func (f *inflight) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.n++
	return true
}

func (f *inflight) leave() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
	if f.closed && f.n == 0 {
		close(f.idle)
	}
}

// close refuses new requests and returns a channel closed when none is in
// progress, and how many are in progress now.
func (f *inflight) close() (<-chan struct{}, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.closed = true
		if f.n == 0 {
			close(f.idle)
		}
	}
	return f.idle, f.n
}

func (f *inflight) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !f.enter() {
			w.Header().Set("Retry-After", strconv.Itoa(int(retryShuttingDown/time.Second)))
			writeJSON(w, http.StatusServiceUnavailable, api.Error{Error: ErrShuttingDown.Error()})
			return
		}
		defer f.leave()
		next.ServeHTTP(w, r)
	})
}
