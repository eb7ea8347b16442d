package errlog

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
)

// contentError attaches to a failure a digest of the content it was about,
// so that two different bad contents with the same error message are two
// failures.
type contentError struct {
	err    error
	digest [sha256.Size]byte
}

func (e *contentError) Error() string { return e.err.Error() }
func (e *contentError) Unwrap() error { return e.err }

// WithContent returns err marked as being about content (the PEM that was
// rejected, say), so that Once.Error tells a new bad content with the same
// message from a retry of the old one. The error message is unchanged, and
// the content is kept only as a digest. A nil err stays nil.
func WithContent(err error, content ...[]byte) error {
	if err == nil {
		return nil
	}
	h := sha256.New()
	for _, c := range content {
		_ = binary.Write(h, binary.BigEndian, uint64(len(c)))
		h.Write(c)
	}
	ce := &contentError{err: err}
	h.Sum(ce.digest[:0])
	return ce
}

// failureKey identifies a failure: its message and, when WithContent marked
// it, the digest of its content.
func failureKey(err error) string {
	var ce *contentError
	if errors.As(err, &ce) {
		return err.Error() + "\x00" + string(ce.digest[:])
	}
	return err.Error()
}
