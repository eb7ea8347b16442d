package loopback

import (
	"errors"
	"fmt"
	"time"

	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
)

const (
	// DefaultValidity is the default lifetime of a loopback leaf
	// certificate. The leaf is renewed once 2/3 of it has passed, so with the
	// default a new leaf is made every 16 hours.
	DefaultValidity = 24 * time.Hour
	// MinValidity is the shortest Validity accepted. Shorter lifetimes leave
	// no room for scheduling delays between renewal and expiry; X.509
	// cannot express them, and the leaf is re-issued at most once per
	// authority.MinReissueInterval.
	MinValidity = authority.MinLifetime
)

// CertificateConfig configures a loopback Certificate. The zero value is
// usable and gives the defaults documented on each field.
//
// The CA that signs the leaf is derived from Validity: it lives three
// validities, its successor joins the CA bundle one validity before it
// expires and starts signing a little later (see authority.SelfSignedConfig
// for the exact schedule), so a trust bundle always holds every CA a served
// leaf can chain to.
type CertificateConfig struct {
	// Validity is the lifetime of each loopback leaf certificate.
	// Default DefaultValidity (24h); at least MinValidity.
	Validity time.Duration
	// RenewBefore is how long before a leaf expires it is replaced.
	// Default Validity/3, so the leaf is renewed at 2/3 of its life. It must
	// be positive and shorter than Validity.
	RenewBefore time.Duration
	// KeyType of the CA and leaf keys. Default dynamiccert.ECDSAP256, which
	// is about a thousand times cheaper to generate than upstream's RSA-2048.
	KeyType dynamiccert.KeyType
	// Clock drives rotation, the loopback client's validity checks and the
	// health check. Default clock.RealClock{}. Tests inject a fake clock.
	Clock clock.WithTicker
	// Grace is how long past its renewal time a leaf may still be served
	// before the health check reports that rotation has stalled. Default
	// Validity/10, capped at RenewBefore/2 so that a stall is reported well
	// before the leaf expires. It must not be negative.
	Grace time.Duration
}

// complete fills in defaults and validates.
func (o *CertificateConfig) complete() error {
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.RenewBefore == 0 {
		o.RenewBefore = o.Validity / 3
	}
	if o.KeyType == "" {
		o.KeyType = dynamiccert.ECDSAP256
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	var errs []error
	if o.Validity < MinValidity {
		errs = append(errs, fmt.Errorf("validity %v must be at least %v", o.Validity, MinValidity))
	}
	if o.RenewBefore <= 0 || o.RenewBefore >= o.Validity {
		errs = append(errs, fmt.Errorf("renew-before %v must be positive and shorter than the validity %v", o.RenewBefore, o.Validity))
	}
	if _, err := dynamiccert.ParseKeyType(string(o.KeyType)); err != nil {
		errs = append(errs, err)
	}
	if o.Grace < 0 {
		errs = append(errs, errors.New("grace must not be negative"))
	}
	if o.Grace == 0 {
		o.Grace = min(o.Validity/10, o.RenewBefore/2)
	}
	return errors.Join(errs...)
}
