package s3

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"warmstart/internal/repository"
)

// maxRetries is how often minio-go tries a request that failed on the
// network or with a retryable status. Low, because a demand read of guest
// memory must fail (EIO) rather than stall the VMM for long when the store
// is gone; the chunk cache bounds the whole read anyway.
const maxRetries = 3

// DefaultResponseTimeout is how long a request waits for the store's
// response headers, and a read of a response body for its next byte
// (Options.ResponseTimeout, stallTransport). minio-go's own minute, tried
// maxRetries+1 times, held a verb for over four minutes on a store that
// accepts connections and never answers (a stopped server); a store that
// answers at all answers well within this, a large upload included (the
// clock starts once the body is sent).
const DefaultResponseTimeout = 15 * time.Second

// maxCatalogObjectBytes caps what is read of a record or alias object: a
// larger one is not ours.
const maxCatalogObjectBytes = 1 << 20

// RequestStats count the HTTP requests the backend sent, by method, and
// the body bytes GET responses delivered. Retries count as requests.
type RequestStats struct {
	Gets, Puts, Heads, Deletes, Lists, Posts uint64
	GetBytes                                 uint64
	// FillGets and FillGetBytes are the part of Gets and GetBytes the
	// background fill sent and received. The fill starts when a restore
	// is ready, so none of them is a restore's fetch before ready: a
	// caller that reads the counts once the restore returned finds them
	// there on a busy node, and takes them out to see what the restore
	// fetched. (A later read that joins a block the fill is fetching
	// counts as the fill's.)
	FillGets, FillGetBytes uint64
}

// Sub returns the requests between an earlier sample o and s.
func (s RequestStats) Sub(o RequestStats) RequestStats {
	return RequestStats{
		Gets: s.Gets - o.Gets, Puts: s.Puts - o.Puts, Heads: s.Heads - o.Heads,
		Deletes: s.Deletes - o.Deletes, Lists: s.Lists - o.Lists, Posts: s.Posts - o.Posts,
		GetBytes: s.GetBytes - o.GetBytes,
		FillGets: s.FillGets - o.FillGets, FillGetBytes: s.FillGetBytes - o.FillGetBytes,
	}
}

// fillRequestKey marks the context of the background fill's requests.
type fillRequestKey struct{}

// asFill returns ctx with its requests counted as the fill's.
func asFill(ctx context.Context) context.Context {
	return context.WithValue(ctx, fillRequestKey{}, true)
}

func isFill(ctx context.Context) bool {
	fill, _ := ctx.Value(fillRequestKey{}).(bool)
	return fill
}

// countingTransport counts requests and GET body bytes on their way
// through the underlying transport.
type countingTransport struct {
	next                                     http.RoundTripper
	stall                                    *stallTransport
	gets, puts, heads, deletes, lists, posts atomic.Uint64
	getBytes                                 atomic.Uint64
	fillGets, fillGetBytes                   atomic.Uint64
}

func (t *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet:
		if req.URL.Query().Has("list-type") || req.URL.Query().Has("prefix") {
			t.lists.Add(1)
		} else {
			t.gets.Add(1)
			if isFill(req.Context()) {
				t.fillGets.Add(1)
			}
		}
	case http.MethodPut:
		t.puts.Add(1)
	case http.MethodHead:
		t.heads.Add(1)
	case http.MethodDelete:
		t.deletes.Add(1)
	case http.MethodPost:
		t.posts.Add(1)
	}
	resp, err := t.next.RoundTrip(req)
	if err == nil && req.Method == http.MethodGet && resp.Body != nil {
		body := &countingBody{ReadCloser: resp.Body, n: &t.getBytes}
		if isFill(req.Context()) {
			body.fill = &t.fillGetBytes
		}
		resp.Body = body
	}
	return resp, err
}

func (t *countingTransport) stats() RequestStats {
	return RequestStats{
		Gets: t.gets.Load(), Puts: t.puts.Load(), Heads: t.heads.Load(),
		Deletes: t.deletes.Load(), Lists: t.lists.Load(), Posts: t.posts.Load(),
		GetBytes: t.getBytes.Load(), FillGets: t.fillGets.Load(), FillGetBytes: t.fillGetBytes.Load(),
	}
}

// countingBody counts the bytes read into n, and into fill too when the
// fill sent the request.
type countingBody struct {
	io.ReadCloser
	n, fill *atomic.Uint64
}

func (b *countingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	b.n.Add(uint64(n))
	if b.fill != nil {
		b.fill.Add(uint64(n))
	}
	return n, err
}

// Addressing styles (Options.AddressingStyle): how a request names the
// bucket.
const (
	// AddressingAuto lets the client choose: virtual-hosted style where
	// the endpoint is known to support it (AWS), else path style.
	AddressingAuto = "auto"
	// AddressingPath puts the bucket in the path: host/bucket/key.
	AddressingPath = "path"
	// AddressingVirtual puts it in the host name: bucket.host/key.
	AddressingVirtual = "virtual"
)

// CheckAddressingStyle refuses an addressing style Open would refuse.
func CheckAddressingStyle(style string) error {
	_, err := bucketLookup(style)
	return err
}

func bucketLookup(style string) (minio.BucketLookupType, error) {
	switch style {
	case "", AddressingAuto:
		return minio.BucketLookupAuto, nil
	case AddressingPath:
		return minio.BucketLookupPath, nil
	case AddressingVirtual:
		return minio.BucketLookupDNS, nil
	}
	return 0, fmt.Errorf("%w: addressing style %q (want %s, %s or %s)", repository.ErrInvalidRequest, style, AddressingAuto, AddressingPath, AddressingVirtual)
}

// newClient builds the minio-go client for o.
func newClient(o Options) (*minio.Core, *countingTransport, error) {
	host, secure, err := parseEndpoint(o.Endpoint)
	if err != nil {
		return nil, nil, err
	}
	lookup, err := bucketLookup(o.AddressingStyle)
	if err != nil {
		return nil, nil, err
	}
	next := o.Transport
	if next == nil {
		tr, err := minio.DefaultTransport(secure)
		if err != nil {
			return nil, nil, err
		}
		tr.ResponseHeaderTimeout = cmp.Or(o.ResponseTimeout, DefaultResponseTimeout)
		next = tr
	}
	stall := &stallTransport{next: next, idle: cmp.Or(o.ResponseTimeout, DefaultResponseTimeout)}
	counting := &countingTransport{next: stall, stall: stall}
	client, err := minio.New(host, &minio.Options{
		Creds:        credentialsFor(o),
		Secure:       secure,
		Transport:    counting,
		Region:       o.Region, // set, so no bucket-location request precedes the first call
		BucketLookup: lookup,
		MaxRetries:   maxRetries,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("object store client for %s: %w", o.Endpoint, err)
	}
	return &minio.Core{Client: client}, counting, nil
}

// parseEndpoint accepts host[:port] (HTTPS) or an http:// or https:// URL;
// empty means AWS S3.
func parseEndpoint(endpoint string) (host string, secure bool, err error) {
	if endpoint == "" {
		return "s3.amazonaws.com", true, nil
	}
	if !strings.Contains(endpoint, "://") {
		return endpoint, true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", false, fmt.Errorf("%w: endpoint %q: %v", repository.ErrInvalidRequest, endpoint, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return "", false, fmt.Errorf("%w: endpoint %q: want host[:port] or http(s)://host[:port]", repository.ErrInvalidRequest, endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// schemeHint adds to err, the first answer of the store at endpoint, what
// to write when endpoint has no scheme (so means HTTPS, as for AWS S3)
// but the store answered plain HTTP: the TLS client alone says only that
// "server gave HTTP response to HTTPS client". net/http has no exported
// error for it, so its message is what is matched.
func schemeHint(endpoint string, err error) error {
	if endpoint == "" || strings.Contains(endpoint, "://") ||
		!strings.Contains(err.Error(), "server gave HTTP response to HTTPS client") {
		return err
	}
	return fmt.Errorf("%w: endpoint %s has no scheme, so it means https://; for a store without TLS write http://%s",
		err, endpoint, endpoint)
}

// credentialsFor returns static credentials when configured, else the
// standard AWS chain: environment (AWS_ACCESS_KEY_ID, ...), the shared
// credentials file (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE), then web
// identity, container and instance-metadata credentials.
func credentialsFor(o Options) *credentials.Credentials {
	if o.AccessKeyID != "" || o.SecretAccessKey != "" {
		return credentials.NewStaticV4(o.AccessKeyID, o.SecretAccessKey, "")
	}
	return credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{},
		&credentials.IAM{},
	})
}

// Classified object-store failures.

// IsDenied reports whether the store refused the request's credentials:
// an unknown access key, a signature made with the wrong secret, or a key
// without the permission the request needs.
func IsDenied(err error) bool {
	var er minio.ErrorResponse
	if !errors.As(err, &er) {
		return false
	}
	switch er.Code {
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch":
		return true
	}
	return false
}

func isNotFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == minio.NoSuchKey || code == "NotFound"
}

func isPreconditionFailed(err error) bool {
	return minio.ToErrorResponse(err).Code == minio.PreconditionFailed
}

// ctxErr prefers the context's error, so a cancelled operation reports
// context.Canceled whatever the HTTP layer made of it.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && err != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

// getSmall reads a whole catalog object and returns it with its metadata
// (ETag, LastModified). A missing object is reported with found=false.
func (r *Repo) getSmall(ctx context.Context, key string) (data []byte, info minio.ObjectInfo, found bool, err error) {
	body, info, _, err := r.core.GetObject(ctx, r.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		if isNotFound(err) {
			return nil, info, false, nil
		}
		return nil, info, false, ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	defer body.Close()
	data, err = io.ReadAll(io.LimitReader(body, maxCatalogObjectBytes+1))
	if err != nil {
		return nil, info, false, ctxErr(ctx, fmt.Errorf("get %s: %w", key, err))
	}
	if len(data) > maxCatalogObjectBytes {
		return nil, info, false, fmt.Errorf("get %s: %w: larger than %d bytes", key, repository.ErrIntegrity, maxCatalogObjectBytes)
	}
	return data, info, true, nil
}

// putCondition is the precondition of a catalog write.
type putCondition struct {
	// ifNoneMatch makes the write fail if the object exists.
	ifNoneMatch bool
	// ifMatch, when not empty, makes it fail unless the object's ETag is this.
	ifMatch string
}

// errPrecondition and errGone report a conditional write that did not
// happen because the object exists or changed (412), or is gone (404).
var (
	errPrecondition = errors.New("precondition failed")
	errGone         = errors.New("object gone")
)

// putSmall writes a catalog object under cond and returns its new ETag.
func (r *Repo) putSmall(ctx context.Context, key string, data []byte, cond putCondition) (string, error) {
	opts := minio.PutObjectOptions{ContentType: "application/json"}
	if cond.ifNoneMatch {
		opts.SetMatchETagExcept("*")
	}
	if cond.ifMatch != "" {
		opts.SetMatchETag(cond.ifMatch)
	}
	info, err := r.core.PutObject(ctx, r.bucket, key, bytes.NewReader(data), int64(len(data)), "", sha256Hex(data), opts)
	switch {
	case err == nil:
		return info.ETag, nil
	case isPreconditionFailed(err):
		return "", fmt.Errorf("put %s: %w", key, errPrecondition)
	case cond.ifMatch != "" && isNotFound(err):
		return "", fmt.Errorf("put %s: %w", key, errGone)
	}
	return "", ctxErr(ctx, fmt.Errorf("put %s: %w", key, err))
}

// remove deletes one object; a missing one is not an error.
func (r *Repo) remove(ctx context.Context, key string) error {
	err := r.core.RemoveObject(ctx, r.bucket, key, minio.RemoveObjectOptions{})
	if err != nil && !isNotFound(err) {
		return ctxErr(ctx, fmt.Errorf("delete %s: %w", key, err))
	}
	return nil
}

// list returns the keys under prefix.
func (r *Repo) list(ctx context.Context, prefix string) ([]minio.ObjectInfo, error) {
	var out []minio.ObjectInfo
	for obj := range r.core.Client.ListObjects(ctx, r.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return nil, ctxErr(ctx, fmt.Errorf("list %s: %w", prefix, obj.Err))
		}
		out = append(out, obj)
	}
	return out, nil
}
