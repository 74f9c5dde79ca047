package s3

import (
	"context"
	"errors"
	"fmt"

	"github.com/minio/minio-go/v7"
)

// ErrNoBucket is wrapped by Open when the bucket does not exist.
var ErrNoBucket = errors.New("bucket does not exist")

// CreateBucket creates o's bucket in o.Region unless it exists, and
// reports whether it created it. A bucket this account already owns is
// no error: creating the repository's bucket is safe to repeat.
func CreateBucket(ctx context.Context, o Options) (created bool, err error) {
	if o.Bucket == "" {
		return false, errors.New("create bucket: no bucket given")
	}
	core, _, err := newClient(o)
	if err != nil {
		return false, fmt.Errorf("create bucket %s: %w", o.Bucket, err)
	}
	ok, err := core.BucketExists(ctx, o.Bucket)
	if err != nil {
		return false, fmt.Errorf("create bucket %s: %w", o.Bucket, schemeHint(o.Endpoint, ctxErr(ctx, err)))
	}
	if ok {
		return false, nil
	}
	err = core.MakeBucket(ctx, o.Bucket, minio.MakeBucketOptions{Region: o.Region})
	if minio.ToErrorResponse(err).Code == "BucketAlreadyOwnedByYou" {
		return false, nil // another node created it meanwhile
	}
	if err != nil {
		return false, fmt.Errorf("create bucket %s: %w", o.Bucket, ctxErr(ctx, err))
	}
	return true, nil
}
