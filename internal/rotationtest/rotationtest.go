// Package rotationtest tells tests when a provider's Run loop has caught up
// with a fake clock and which certificate a controller serves, so that a
// test steps the clock and then checks what clients see. It is shared by the
// nested test modules (test/controllerruntime, test/grpc). See
// docs/architecture.md.
package rotationtest

import (
	"time"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/sni"
)

// Settled reports whether p's Run loop has caught up with now: nothing its
// schedule does is due (leaf renewal, publishing a successor CA, letting the
// successor sign). Only then is the leaf it holds the one it serves at now.
func Settled(p *authority.SelfSigned, now time.Time) bool {
	st := p.Status()
	switch {
	case p.Leaf() == nil || !p.RenewAt().After(now):
		return false
	case st.Successor == nil:
		return st.Signing.NotAfter.Sub(now) > p.Config().CARenewBefore
	default:
		return st.Successor.SignsNoEarlierThan.After(now)
	}
}

// DefaultServedSerial returns the serial (hex) of the certificate ctrl
// serves by default, or "" when it serves none.
func DefaultServedSerial(ctrl *sni.DynamicServingCertificateController) string {
	for _, c := range ctrl.Served() {
		if c.IsDefault {
			return c.Serial
		}
	}
	return ""
}
