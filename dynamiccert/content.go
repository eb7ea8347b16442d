package dynamiccert

import "time"

// zeroTime asks pki to skip validity-date checks.
var zeroTime time.Time

func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}
