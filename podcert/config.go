package podcert

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
)

// Limits the PodCertificateRequest API enforces on an issued certificate.
const (
	// MinLifetime is the shortest NotAfter-NotBefore the API accepts.
	MinLifetime = time.Hour
	// MaxLifetime is the longest maxExpirationSeconds the API accepts,
	// 91 days.
	MaxLifetime = 91 * 24 * time.Hour
	// DefaultMaxExpiration is the request's maxExpirationSeconds when it
	// sets none, 24 hours.
	DefaultMaxExpiration = 24 * time.Hour
	// MaxBackdate bounds SignerConfig.Backdate: the API wants NotBefore
	// within 5 minutes of its own clock, and the write takes a moment.
	MaxBackdate = 5 * time.Minute
	// refreshMargin is how far beginRefreshAt must stay from NotBefore and
	// NotAfter.
	refreshMargin = 10 * time.Minute
)

// Defaults for SignerConfig.
const (
	// DefaultMaxLifetimeCap caps leaves at 24 hours (what kubernetes.io
	// signers issue at most) whatever maxExpirationSeconds allows.
	DefaultMaxLifetimeCap = 24 * time.Hour
	// DefaultBackdate is how far NotBefore lies before the signing time, for
	// clients whose clocks are a little behind; upstream's test signer uses
	// the same.
	DefaultBackdate = 2 * time.Minute
)

// LeafSigner signs the leaves: *authority.Authority, whose SignLeaf signs
// only with its observed signing CA and whose listeners hear when that CA
// changes.
type LeafSigner interface {
	// Name identifies it in logs and condition messages.
	Name() string
	// SignLeaf signs a key held elsewhere; errors wrapping
	// authority.ErrNoSigningCA and *authority.CAEndsTooSoonError mean
	// "not now".
	SignLeaf(authority.LeafRequest) (*authority.SignedLeaf, error)
	// AddListener registers a listener told when the signing CA changes.
	AddListener(dynamiccertificates.Listener)
}

var _ LeafSigner = &authority.Authority{}

// SignerConfig configures a Signer. Fields marked required have no default;
// the others may be left zero.
type SignerConfig struct {
	// SignerName is the spec.signerName the Signer serves, e.g.
	// "evercert.io/serving"; requests for other signers are left alone.
	// Required. Names under kubernetes.io are reserved.
	SignerName string
	// CA signs the leaves, normally a *authority.Authority that runs
	// (its Run loop rotates the CA). Required. An Authority whose schedule
	// can never give a leaf MinLifetime (CASchedule.LongestLeaf) is an
	// error wrapping ErrCANeverCoversMinLifetime.
	CA LeafSigner
	// Client reads the requests (list, watch), the Pods (get) and the
	// Services (list) and writes the requests' status. Required. RBAC:
	// see example/signer/rbac.yaml.
	Client kubernetes.Interface
	// Policy says who gets which names. Required: it must have a rule.
	Policy Policy
	// KeyTypes are the key types issued to; others are denied with reason
	// UnsupportedKeyType. Default DefaultKeyTypes.
	KeyTypes []string
	// MaxLifetime caps every leaf below the request's maxExpirationSeconds.
	// Default DefaultMaxLifetimeCap; from MinLifetime to MaxLifetime.
	MaxLifetime time.Duration
	// Backdate puts NotBefore this long before signing, for clients whose
	// clocks are behind. Default (and when zero) DefaultBackdate; below
	// MaxBackdate.
	Backdate time.Duration
	// EventRecorder, when set, receives a Warning Event about the request
	// for every denial and failure.
	EventRecorder events.EventRecorder
	// Clock drives lifetimes, condition times, latencies and retries.
	// Default clock.RealClock{}.
	Clock clock.WithTicker
}

// complete fills in the defaults and returns every problem, each naming
// its field.
func (c *SignerConfig) complete() error {
	if c.KeyTypes == nil {
		c.KeyTypes = DefaultKeyTypes
	}
	if c.MaxLifetime == 0 {
		c.MaxLifetime = DefaultMaxLifetimeCap
	}
	if c.Backdate == 0 {
		c.Backdate = DefaultBackdate
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	var errs []error
	if err := ValidateSignerName(c.SignerName); err != nil {
		errs = append(errs, fmt.Errorf("SignerConfig.SignerName: %w", err))
	}
	if c.CA == nil {
		errs = append(errs, errors.New("SignerConfig.CA: required"))
	}
	if c.Client == nil {
		errs = append(errs, errors.New("SignerConfig.Client: required"))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("SignerConfig.Policy: %w", err))
	}
	if len(c.KeyTypes) == 0 {
		errs = append(errs, errors.New("SignerConfig.KeyTypes: empty: every request would be denied"))
	} else if err := checkKeyTypes(c.KeyTypes); err != nil {
		errs = append(errs, fmt.Errorf("SignerConfig.KeyTypes: %w", err))
	}
	if c.MaxLifetime < MinLifetime || c.MaxLifetime > MaxLifetime {
		errs = append(errs, fmt.Errorf("SignerConfig.MaxLifetime: %v is outside the API's %v to %v", c.MaxLifetime, MinLifetime, MaxLifetime))
	}
	if c.Backdate < 0 || c.Backdate >= MaxBackdate {
		errs = append(errs, fmt.Errorf("SignerConfig.Backdate: %v must be at least 0 and below %v (the API wants NotBefore within 5 minutes of its clock)", c.Backdate, MaxBackdate))
	} else if sched, ok := caSchedule(c.CA); ok {
		if err := sched.check(c.Backdate); err != nil {
			errs = append(errs, fmt.Errorf("SignerConfig.CA: %w", err))
		}
	}
	return errors.Join(errs...)
}

// ValidateSignerName reports whether name can be a signer name:
// "<domain>/<path>" with a fully qualified domain outside the reserved
// kubernetes.io.
func ValidateSignerName(name string) error {
	domain, path, ok := strings.Cut(name, "/")
	switch {
	case name == "":
		return errors.New("required, e.g. \"evercert.io/serving\"")
	case !ok || path == "":
		return fmt.Errorf("%q must be <domain>/<path>, e.g. \"evercert.io/serving\"", name)
	case domain == "kubernetes.io" || strings.HasSuffix(domain, ".kubernetes.io"):
		return fmt.Errorf("%q: signer names under kubernetes.io are reserved for Kubernetes", name)
	}
	if msgs := validation.IsDNS1123Subdomain(domain); len(msgs) > 0 || !strings.Contains(domain, ".") {
		return fmt.Errorf("%q: the domain must be a fully qualified DNS name: %s", name, strings.Join(msgs, "; "))
	}
	return nil
}
