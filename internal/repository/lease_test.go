package repository

import (
	"errors"
	"testing"
)

type issuer struct{ name string }

// TestHeldLeaseOwnership: a lease is accepted only by the repository that
// issued it, even by another repository of the same backend.
func TestHeldLeaseOwnership(t *testing.T) {
	a, b := &issuer{"a"}, &issuer{"b"}
	l := NewHeldLease(a, "id", func() {})
	if own, err := OwnLease(a, l); err != nil || own != l {
		t.Fatalf("OwnLease by its issuer = %v, %v", own, err)
	}
	if _, err := OwnLease(b, l); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("OwnLease by another repository: %v, want ErrInvalidRequest", err)
	}
	var none *HeldLease
	if _, err := OwnLease(a, none); !errors.Is(err, ErrInvalidRequest) {
		t.Fatalf("OwnLease of a nil lease: %v, want ErrInvalidRequest", err)
	}
}

// TestHeldLeaseEndWaitsForOperations: End waits for an operation in
// flight, runs release once after it, closes Done, and no operation runs
// after it.
func TestHeldLeaseEndWaitsForOperations(t *testing.T) {
	iss := &issuer{}
	releases := 0
	l := NewHeldLease(iss, "id", func() { releases++ })
	inside, finish := make(chan struct{}), make(chan struct{})
	published := make(chan error, 1)
	go func() {
		_, err := PublishUnderLease(iss, l, func(string) (Record, error) {
			close(inside)
			<-finish
			// End, once called, waits: the lease is not ended yet.
			select {
			case <-l.Done():
				return Record{}, errors.New("Done closed while an operation under the lease was running")
			default:
			}
			if releases != 0 {
				return Record{}, errors.New("released while an operation under the lease was running")
			}
			return Record{ID: "id"}, nil
		})
		published <- err
	}()
	<-inside
	ended := make(chan struct{})
	go func() {
		l.End()
		close(ended)
	}()
	select {
	case <-ended:
		t.Fatal("End returned while an operation under the lease was running")
	default:
	}
	close(finish)
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	<-ended
	<-l.Done()
	if err := l.End(); err != nil || releases != 1 {
		t.Fatalf("second End = %v, %d releases; want nil, 1", err, releases)
	}
	ran := false
	_, err := PublishUnderLease(iss, l, func(string) (Record, error) { ran = true; return Record{}, nil })
	if !errors.Is(err, ErrLeaseEnded) || ran || err.Error() != "publish: snapshot id: capture lease ended" {
		t.Fatalf("publish after End: %v (ran %v)", err, ran)
	}
}

// TestUnderLeaseErrors: the operations name themselves and the snapshot in
// their errors, and bad data is refused before the lease is used.
func TestUnderLeaseErrors(t *testing.T) {
	iss := &issuer{}
	l := NewHeldLease(iss, "id", func() {})
	cause := errors.New("disk on fire")
	_, err := PublishUnderLease(iss, l, func(string) (Record, error) { return Record{}, cause })
	if !errors.Is(err, cause) || err.Error() != "publish id: disk on fire" {
		t.Errorf("publish: %v", err)
	}
	attached := false
	attach := func(id string, a Attachment) error { attached = true; return cause }
	_, err = AttachManifestUnderLease(iss, l, nil, nil, attach)
	if !errors.Is(err, ErrInvalidRequest) || attached {
		t.Errorf("attach of an empty manifest: %v (attached %v)", err, attached)
	}
	_, err = AttachDigestsUnderLease(iss, l, []byte("table"), attach)
	if !errors.Is(err, cause) || err.Error() != "attach digest table id: disk on fire" {
		t.Errorf("attach digests: %v", err)
	}
	_, err = AttachManifestUnderLease(&issuer{}, l, []byte("m"), nil, attach)
	if !errors.Is(err, ErrInvalidRequest) || err.Error() != "attach manifest: invalid request: the lease was not issued by this repository" {
		t.Errorf("attach under a foreign lease: %v", err)
	}
}
