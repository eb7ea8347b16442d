package tlstest

import (
	"math/big"
	"net/http"
	"sync/atomic"

	"k8s.io/client-go/rest"
)

// RecordServedSerials wraps cfg (in place) so that every response records
// the serial number of the server leaf it came over, as the client saw and
// verified it. The returned pointer holds the latest.
func RecordServedSerials(cfg *rest.Config) *atomic.Pointer[big.Int] {
	p := new(atomic.Pointer[big.Int])
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return serialRecorder{rt: rt, serial: p} })
	return p
}

type serialRecorder struct {
	rt     http.RoundTripper
	serial *atomic.Pointer[big.Int]
}

func (s serialRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := s.rt.RoundTrip(req)
	if err == nil && resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		s.serial.Store(resp.TLS.PeerCertificates[0].SerialNumber)
	}
	return resp, err
}
