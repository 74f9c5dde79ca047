package s3

import (
	"crypto/rand"
	"errors"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"warmstart/internal/repository"
	"warmstart/internal/repository/repotest"
)

// rewriteOnChunkStat is a transport that, at the first look for a chunk
// (the HEAD before its upload), rewrites the import's memory file in
// place with other bytes of the same size: a VMM still writing it.
type rewriteOnChunkStat struct {
	t    *testing.T
	path string
	once sync.Once
}

func (w *rewriteOnChunkStat) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodHead && strings.Contains(req.URL.Path, chunksDir) {
		w.once.Do(func() {
			fi, err := os.Stat(w.path)
			f, oerr := os.OpenFile(w.path, os.O_WRONLY, 0)
			if err = errors.Join(err, oerr); err == nil {
				other := make([]byte, fi.Size())
				_, _ = rand.Read(other)
				_, err = f.WriteAt(other, 0)
				err = errors.Join(err, f.Close())
			}
			if err != nil {
				w.t.Errorf("rewrite %s: %v", w.path, err)
			}
		})
	}
	return passThrough().RoundTrip(req)
}

// TestSourceWrittenDuringUpload: a memory file that changes while an
// import uploads it is the request's fault (something still writes the
// file it sent), answered on its field as an invalid request, as the
// POSIX store does, not as an integrity failure of stored data.
func TestSourceWrittenDuringUpload(t *testing.T) {
	needServer(t)
	in := repotest.NewInputs(t, repotest.SmallMemoryBytes)
	o := chunkyOptions(t, server.Endpoint, "")
	o.Transport = &rewriteOnChunkStat{t: t, path: in.MemoryPath}
	r := openWith(t, o)
	lease := beginCapture(t, r)
	_, err := r.Publish(bg(), lease, in.Request("torn"))
	if err == nil || !strings.Contains(err.Error(), "changed while") || !strings.Contains(err.Error(), in.MemoryPath) {
		t.Fatalf("Publish of a memory file written during its upload = %v, want an error naming it as changed", err)
	}
	if ie := (*repository.IntegrityError)(nil); errors.As(err, &ie) {
		t.Fatalf("Publish of a memory file written during its upload = %v, an integrity error; want an invalid request", err)
	}
	if fe := (*repository.FieldError)(nil); !errors.As(err, &fe) || fe.Field != repository.FieldMemory ||
		!errors.Is(err, repository.ErrInvalidRequest) {
		t.Fatalf("Publish of a memory file written during its upload = %v, want an invalid request on field %q",
			err, repository.FieldMemory)
	}
}
