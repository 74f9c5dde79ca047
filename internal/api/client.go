package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"warmstart/internal/recorder"
	"warmstart/internal/repository"
	"warmstart/internal/snapcheck"
	"warmstart/internal/trust"
)

// maxResponseBytes bounds what the client reads of one answer.
const maxResponseBytes = 64 << 20

// readAnswerTimeout bounds how long a read-only request (GET: health,
// lists, a snapshot's record, metrics) waits for the whole answer. A
// daemon that is stopped (SIGSTOP) or wedged keeps its socket and the
// kernel completes every connect, so without a bound `restores list`
// would wait for ever. None of these answers takes long; requests that
// change something (an import, a restore, a verify) take as long as
// their work and are not bounded here.
var readAnswerTimeout = time.Minute

// errNoAnswer is the cause of a read-only request's cancellation when
// readAnswerTimeout passed.
var errNoAnswer = errors.New("no answer in time")

// boundRead bounds a read-only request (GET) that has no deadline of its
// own by readAnswerTimeout.
func boundRead(ctx context.Context, method string) (context.Context, context.CancelFunc) {
	if _, bounded := ctx.Deadline(); method != http.MethodGet || bounded {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, readAnswerTimeout, errNoAnswer)
}

// Client talks to a running daemon.
type Client struct {
	hc    *http.Client
	base  string
	token string
	// addr is the endpoint as given, for errors: base does not name a
	// Unix socket.
	addr string
}

// WithToken makes the client send token as its bearer token, which a
// daemon serving TCP requires.
func (c *Client) WithToken(token string) *Client {
	c.token = token
	return c
}

// NewClient returns a client for the daemon at endpoint: the path of its
// Unix socket, or http://host:port for a daemon serving TCP.
func NewClient(endpoint string) *Client {
	if strings.HasPrefix(endpoint, "http://") || strings.HasPrefix(endpoint, "https://") {
		return &Client{hc: &http.Client{}, base: strings.TrimSuffix(endpoint, "/"), addr: endpoint}
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", endpoint)
		},
	}
	// The host is never dialled; it only fills the request line.
	return &Client{hc: &http.Client{Transport: tr}, base: "http://warmstart", addr: endpoint}
}

// Close drops idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// APIError is an answer with a 4xx or 5xx status. It matches
// repository.ErrNotFound (404), repository.ErrAliasConflict (409),
// repository.ErrInvalidRequest (400) and, for a 403 about the snapshot
// (field snapshot or id), trust.ErrUntrusted with errors.Is, so callers
// branch as they do in process.
type APIError struct {
	StatusCode int
	Message    string
	Field      string
	// RetryAfter is the answer's Retry-After (a 503 for an unreachable
	// store): when to try again. Zero when the answer had none.
	RetryAfter time.Duration
}

func (e *APIError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("daemon: %s (field %s, HTTP %d)", e.Message, e.Field, e.StatusCode)
	}
	return fmt.Sprintf("daemon: %s (HTTP %d)", e.Message, e.StatusCode)
}

// Is maps the status to the repository's sentinel errors.
func (e *APIError) Is(target error) bool {
	switch e.StatusCode {
	case http.StatusNotFound:
		return target == repository.ErrNotFound
	case http.StatusConflict:
		return target == repository.ErrAliasConflict
	case http.StatusBadRequest:
		return target == repository.ErrInvalidRequest
	case http.StatusForbidden:
		// An import refused by import_dirs is a 403 about a file field.
		return target == trust.ErrUntrusted && (e.Field == "snapshot" || e.Field == "id")
	}
	return false
}

// do sends in (when not nil) as JSON and decodes the answer into out
// (when not nil).
func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("daemon %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	ctx, cancel := boundRead(ctx, method)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("daemon %s %s: %w", method, path, err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.sendError(ctx, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return c.sendError(ctx, method, path, fmt.Errorf("read answer: %w", err))
	}
	if resp.StatusCode >= 400 {
		var e Error
		if json.Unmarshal(data, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(data))
		}
		return &APIError{StatusCode: resp.StatusCode, Message: e.Error, Field: e.Field, RetryAfter: retryAfter(resp.Header)}
	}
	if out == nil {
		return nil
	}
	if s, ok := out.(*string); ok {
		*s = string(data)
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("daemon %s %s: decode answer: %w", method, path, err)
	}
	return nil
}

// sendError is the error of a request that got no answer. One whose
// connection could not be made says so and how to start a daemon: the
// usual reason is that none was started.
func (c *Client) sendError(ctx context.Context, method, path string, err error) error {
	if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
		return fmt.Errorf("daemon %s %s: no daemon answers at %s (%w); start one with `warmstart serve`, or check the address",
			method, path, c.addr, op.Err)
	}
	if errors.Is(context.Cause(ctx), errNoAnswer) {
		return fmt.Errorf("daemon %s %s: the daemon at %s did not answer within %v: it may be stopped or wedged; "+
			"check its process and its log (%w)", method, path, c.addr, readAnswerTimeout, err)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) {
		return fmt.Errorf("daemon %s %s: the daemon at %s closed the connection before it answered: it exited or "+
			"restarted (see its log); what the request asked may or may not have happened, so look before you retry (%w)",
			method, path, c.addr, err)
	}
	return fmt.Errorf("daemon %s %s: %w", method, path, err)
}

// Health asks whether the daemon is up.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	return h, c.do(ctx, http.MethodGet, "/healthz", nil, &h)
}

// Snapshots lists the snapshots that match f, oldest first; Catalog also
// returns the damaged entries.
func (c *Client) Snapshots(ctx context.Context, f repository.Filter) ([]repository.Record, error) {
	rows, err := c.Catalog(ctx, f)
	var recs []repository.Record
	for _, row := range rows {
		if row.Corrupt == nil {
			recs = append(recs, row.Record)
		}
	}
	return recs, err
}

// Catalog is GET /snapshots whole: the records that match f, oldest first,
// then a row for each damaged catalog entry (repository.Listing).
func (c *Client) Catalog(ctx context.Context, f repository.Filter) ([]repository.Entry, error) {
	q := url.Values{}
	if f.AliasPrefix != "" {
		q.Set("alias_prefix", f.AliasPrefix)
	}
	if f.HasManifest != nil {
		q.Set("has_manifest", fmt.Sprint(*f.HasManifest))
	}
	path := "/snapshots"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	var rows []repository.Entry
	return rows, c.do(ctx, http.MethodGet, path, nil, &rows)
}

// Snapshot returns the snapshot with that id or alias.
func (c *Client) Snapshot(ctx context.Context, ref string) (SnapshotInfo, error) {
	var info SnapshotInfo
	return info, c.do(ctx, http.MethodGet, "/snapshots/"+url.PathEscape(ref), nil, &info)
}

// DeleteSnapshot deletes the snapshot with that id or alias.
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) (DeleteResponse, error) {
	var out DeleteResponse
	return out, c.do(ctx, http.MethodDelete, "/snapshots/"+url.PathEscape(ref), nil, &out)
}

// Import publishes files on the daemon's host as a new snapshot. The
// daemon opens them itself, so relative paths are made absolute here, from
// this process's working directory.
func (c *Client) Import(ctx context.Context, req ImportRequest) (ImportResponse, error) {
	var err error
	if req.VMState, err = absolute(req.VMState); err != nil {
		return ImportResponse{}, err
	}
	if req.Memory, err = absolute(req.Memory); err != nil {
		return ImportResponse{}, err
	}
	var out ImportResponse
	return out, c.do(ctx, http.MethodPost, "/snapshots/import", req, &out)
}

// absolute puts the working directory before a relative path and leaves
// the rest as given: not cleaned, since ".." after a symbolic link is not
// the link's parent, and the daemon judges the path it is sent (and names
// it in its errors). An empty path stays empty, for the daemon to refuse.
func absolute(path string) (string, error) {
	if path == "" || filepath.IsAbs(path) {
		return path, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("make %s absolute: %w", path, err)
	}
	return wd + string(filepath.Separator) + path, nil
}

// RecordManifest records the snapshot's startup manifest now and attaches it.
func (c *Client) RecordManifest(ctx context.Context, ref string) (recorder.Result, error) {
	var out recorder.Result
	return out, c.do(ctx, http.MethodPost, "/snapshots/"+url.PathEscape(ref)+"/manifest:record", nil, &out)
}

// VerifySnapshot reads every artifact of the snapshot with that id or
// alias on the daemon and returns the report; problems found are in the
// report (OK false), not an error.
func (c *Client) VerifySnapshot(ctx context.Context, ref string, req VerifyRequest) (snapcheck.Report, error) {
	var out snapcheck.Report
	return out, c.do(ctx, http.MethodPost, "/snapshots/"+url.PathEscape(ref)+"/verify", req, &out)
}

// VerifyAll verifies every snapshot the daemon's catalog lists, as
// snapcheck.VerifyAll does in process: a damaged catalog entry is a report
// of its own, after the others, and a snapshot deleted since the listing
// is left out. each, when not nil, is told of each snapshot before it is
// verified. An error names the snapshot it is about.
func (c *Client) VerifyAll(ctx context.Context, req VerifyRequest, each func(id string)) ([]snapcheck.Report, error) {
	// The catalog, not the snapshot list: damaged entries are reported too.
	rows, err := c.Catalog(ctx, repository.Filter{})
	if err != nil {
		return nil, err
	}
	reports := make([]snapcheck.Report, 0, len(rows))
	var damaged []snapcheck.Report
	for _, rec := range rows {
		if rec.Corrupt != nil {
			damaged = append(damaged, snapcheck.DamagedEntry(*rec.Corrupt))
			continue
		}
		if each != nil {
			each(rec.ID)
		}
		rep, err := c.VerifySnapshot(ctx, rec.ID, req)
		if errors.Is(err, repository.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", rec.ID, err)
		}
		reports = append(reports, rep)
	}
	return append(reports, damaged...), nil
}

// Restore restores a snapshot; the daemon holds it until StopRestore.
func (c *Client) Restore(ctx context.Context, req RestoreRequest) (RestoreInfo, error) {
	var out RestoreInfo
	return out, c.do(ctx, http.MethodPost, "/restores", req, &out)
}

// Restores lists the restores the daemon holds, oldest first.
func (c *Client) Restores(ctx context.Context) ([]RestoreInfo, error) {
	var out []RestoreInfo
	return out, c.do(ctx, http.MethodGet, "/restores", nil, &out)
}

// StopRestore stops a restore in the seed's order.
func (c *Client) StopRestore(ctx context.Context, id string) (StopResponse, error) {
	var out StopResponse
	return out, c.do(ctx, http.MethodDelete, "/restores/"+url.PathEscape(id), nil, &out)
}

// Pause pauses a pausable restore into a child snapshot.
func (c *Client) Pause(ctx context.Context, id string, req PauseRequest) (PauseResult, error) {
	var out PauseResult
	return out, c.do(ctx, http.MethodPost, "/restores/"+url.PathEscape(id)+"/snapshot", req, &out)
}

// Metrics returns the Prometheus text exposition.
func (c *Client) Metrics(ctx context.Context) (string, error) {
	var out string
	return out, c.do(ctx, http.MethodGet, "/metrics", nil, &out)
}

// retryAfter is a Retry-After header given in seconds; zero when absent
// or an HTTP date (the daemon sends seconds).
func retryAfter(h http.Header) time.Duration {
	n, err := strconv.Atoi(h.Get("Retry-After"))
	if err != nil || n < 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}
