package node

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"warmstart/internal/chunkcache"
	"warmstart/internal/config"
	"warmstart/internal/repository"
	"warmstart/internal/repository/posixfs"
	"warmstart/internal/repository/s3"
	"warmstart/internal/trust"
)

// RepositoryOptions adjust how OpenRepository opens the configured
// repository.
type RepositoryOptions struct {
	// Store, when set, is a POSIX store directory used instead of the
	// configured repository (the CLI's --store).
	Store string
	// ReadOnly opens a POSIX store without creating, locking or sweeping
	// anything; a store that does not exist is then an error naming it.
	ReadOnly bool
	// Warn is told what a POSIX store's sweep at a writable open could not
	// clean up (posixfs.Options.Warn); nil ignores it.
	Warn func(error)
	// Log receives an S3 repository's node cache warnings
	// (s3.Options.Log); nil discards them.
	Log *slog.Logger
}

// OpenRepository opens the snapshot repository cfg names. A writable one
// signs every record it publishes with [trust] signing_key when set.
func OpenRepository(ctx context.Context, cfg *config.Config, o RepositoryOptions) (repository.Repository, error) {
	key, err := publishKey(cfg, o)
	if err != nil {
		return nil, err
	}
	if o.Store != "" {
		return openPosixFS(o.Store, o, key)
	}
	switch cfg.Snapshot.RepositoryBackend {
	case config.BackendPosixFS:
		return openPosixFS(cfg.Backend.PosixFS.SnapshotStore, o, key)
	case config.BackendS3:
		so := S3Options(cfg.Backend.S3)
		so.ReadOnly, so.Log, so.SigningKey = o.ReadOnly, o.Log, key
		repo, err := s3.Open(ctx, so)
		if errors.Is(err, s3.ErrNoBucket) {
			return nil, fmt.Errorf("%w at %s: create it with `warmstart store init` (it needs the s3:CreateBucket permission), or set [backend.s3] bucket to one that exists", err, endpointName(cfg.Backend.S3.Endpoint))
		}
		if err != nil {
			return nil, s3Hint(err, cfg.Backend.S3)
		}
		return repo, nil
	default:
		return nil, fmt.Errorf("snapshot.repository_backend %q is not available in this build", cfg.Snapshot.RepositoryBackend)
	}
}

// S3Options are the s3 repository's options from [backend.s3]: the
// configuration's addressing_style values are the s3 package's
// (TestS3TakesTheConfiguredAddressingStyles).
func S3Options(c config.S3Config) s3.Options {
	return s3.Options{
		Endpoint:        c.Endpoint,
		Bucket:          c.Bucket,
		Region:          c.Region,
		Prefix:          c.Prefix,
		AddressingStyle: c.AddressingStyle,
		AccessKeyID:     c.AccessKeyID,
		SecretAccessKey: c.SecretAccessKey,
		CacheDir:        c.CacheDir,
		CacheMaxBytes:   c.CacheMaxBytes(),
		BlockBytes:      c.ChunkSizeBytes(),
		ChunkBytes:      c.ChunkSizeBytes(),
		Fill: s3.FillOptions{Disabled: !c.BackgroundFill, Concurrency: int(c.BackgroundFillConcurrency),
			BitsPerSec: c.BackgroundFillMbit * 1_000_000},
		Warm: chunkcache.WarmOptions{Concurrency: int(c.PackConcurrency)},
	}
}

// publishKey is the key a writable repository signs with.
func publishKey(cfg *config.Config, o RepositoryOptions) (ed25519.PrivateKey, error) {
	if o.ReadOnly {
		return nil, nil
	}
	return SigningKey(cfg)
}

// SigningKey is the private key of [trust] signing_key, nil when none is
// configured: what a repository that publishes signs its records with.
func SigningKey(cfg *config.Config) (ed25519.PrivateKey, error) {
	if cfg.Trust.SigningKey == "" {
		return nil, nil
	}
	k, err := trust.LoadPrivate(cfg.Trust.SigningKey)
	if err != nil {
		return nil, fmt.Errorf("[trust] signing_key: %w", err)
	}
	return k.Private, nil
}

// TrustPolicy is the policy of a node with cfg: the keys of [trust]
// trusted_keys and, with any, that of signing_key.
func TrustPolicy(cfg *config.Config) (*trust.Policy, error) {
	var own *trust.Key
	if cfg.Trust.SigningKey != "" && len(cfg.Trust.TrustedKeys) > 0 {
		k, err := trust.LoadPrivate(cfg.Trust.SigningKey)
		if err != nil {
			return nil, fmt.Errorf("[trust] signing_key: %w", err)
		}
		own = &k
	}
	p, err := trust.LoadPolicy(cfg.Trust.TrustedKeys, own)
	if err != nil {
		return nil, fmt.Errorf("[trust] trusted_keys: %w", err)
	}
	return p, nil
}

// endpointName is how an error names the object store [backend.s3]
// endpoint points at.
func endpointName(endpoint string) string {
	if endpoint == "" {
		return "AWS S3"
	}
	return endpoint
}

// s3Hint adds to err, when the object store refused the credentials,
// which keys hold them: the store's own words name neither; and, when it
// did not answer, which key names it.
func s3Hint(err error, c config.S3Config) error {
	if errors.Is(err, repository.ErrUnreachable) {
		return fmt.Errorf("%w: is the object store [backend.s3] endpoint names (%s) running?", err, endpointName(c.Endpoint))
	}
	if !s3.IsDenied(err) {
		return err
	}
	if c.AccessKeyID != "" {
		return fmt.Errorf("%w: %s refused access key %s: check [backend.s3] access_key_id and secret_access_key, "+
			"and that the key may use bucket %s", err, endpointName(c.Endpoint), c.AccessKeyID, c.Bucket)
	}
	return fmt.Errorf("%w: [backend.s3] access_key_id and secret_access_key are empty, so the AWS chain "+
		"(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the shared credentials file, instance metadata) "+
		"supplied the credentials and %s refused them: set both keys, or the chain's", err, endpointName(c.Endpoint))
}

// InitRepository creates the repository cfg names, where it does not
// exist yet, and says what it did: the S3 bucket (in [backend.s3]
// region), or the POSIX store directory. Safe to repeat.
func InitRepository(ctx context.Context, cfg *config.Config) (string, error) {
	switch cfg.Snapshot.RepositoryBackend {
	case config.BackendS3:
		c := cfg.Backend.S3
		created, err := s3.CreateBucket(ctx, S3Options(c))
		if err != nil {
			return "", s3Hint(err, c)
		}
		if !created {
			return fmt.Sprintf("bucket %s at %s exists", c.Bucket, endpointName(c.Endpoint)), nil
		}
		return fmt.Sprintf("created bucket %s at %s (region %s)", c.Bucket, endpointName(c.Endpoint), c.Region), nil
	case config.BackendPosixFS:
		store := cfg.Backend.PosixFS.SnapshotStore
		// A writable open creates the store's layout; it holds nothing open.
		if _, err := posixfs.Open(store, posixfs.Options{}); err != nil {
			return "", err
		}
		return fmt.Sprintf("store %s is ready", store), nil
	}
	return "", fmt.Errorf("snapshot.repository_backend %q is not available in this build", cfg.Snapshot.RepositoryBackend)
}

func openPosixFS(store string, o RepositoryOptions, key ed25519.PrivateKey) (repository.Repository, error) {
	repo, err := posixfs.Open(store, posixfs.Options{ReadOnly: o.ReadOnly, Warn: o.Warn, SigningKey: key})
	if err != nil {
		return nil, missingStoreHint(err, store, o.Store != "")
	}
	return repo, nil
}

// missingStoreHint adds to err, when store itself does not exist, where
// its path came from and how to make one: a first run without a
// configuration opens the built-in default store, which nobody created.
func missingStoreHint(err error, store string, fromFlag bool) error {
	if _, serr := os.Stat(store); !errors.Is(serr, fs.ErrNotExist) {
		return err
	}
	if fromFlag {
		return fmt.Errorf("%w: no snapshot store there: check --store (a first `snapshot import --store DIR` creates one)", err)
	}
	return fmt.Errorf("%w: no snapshot store there: [backend.posix_fs] snapshot_store names it "+
		"(configuration: --config, else $%s, else %s when present, else the built-in defaults); "+
		"point it at your store, or create an empty one with `warmstart store init`", err, config.EnvFile, config.SystemFile)
}
