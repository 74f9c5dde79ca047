package qemu

import (
	"bytes"
	"fmt"
	"io"
	"os"
)

// copyPageBytes is the unit copySparse tests for zeros: a guest page.
const copyPageBytes = 4096

// copySparse copies the file at src to a new file dst (mode 0600,
// fsynced), leaving all-zero pages as holes: most of a guest's memory is
// pages it never touched, and writing them would cost the disk the whole
// guest size for every capture.
func copySparse(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy memory: %w", err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("copy memory: %w", err)
	}
	defer func() {
		if cerr := out.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("copy memory to %s: %w", dst, cerr)
		}
	}()
	size, err := copyNonZeroPages(in, out)
	if err != nil {
		return fmt.Errorf("copy memory %s to %s: %w", src, dst, err)
	}
	if err := out.Truncate(size); err != nil {
		return fmt.Errorf("copy memory to %s: %w", dst, err)
	}
	if err := out.Sync(); err != nil {
		return fmt.Errorf("copy memory to %s: %w", dst, err)
	}
	return nil
}

// copyNonZeroPages writes every page of in that is not all zero to the
// same offset of out and returns in's length.
func copyNonZeroPages(in io.Reader, out io.WriterAt) (int64, error) {
	buf := make([]byte, 256*copyPageBytes)
	zero := make([]byte, copyPageBytes)
	var off int64
	for {
		n, err := io.ReadFull(in, buf)
		for p := 0; p < n; p += copyPageBytes {
			page := buf[p:min(p+copyPageBytes, n)]
			if bytes.Equal(page, zero[:len(page)]) {
				continue
			}
			if _, werr := out.WriteAt(page, off+int64(p)); werr != nil {
				return 0, werr
			}
		}
		off += int64(n)
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return off, nil
		case err != nil:
			return 0, err
		}
	}
}
