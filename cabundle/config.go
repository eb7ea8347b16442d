package cabundle

import (
	"errors"
	"fmt"
	"time"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
)

// This file holds the configuration of a Publisher, its defaults and its
// validation.

const (
	// DefaultResync is the default period of the safety-net re-publish.
	DefaultResync = time.Minute
	// DefaultFieldManager is the default field manager of every write.
	DefaultFieldManager = "evercert"
	// DefaultName is the default name of the publisher as an observer
	// (authority.Observer) and of its health check.
	DefaultName = "cabundle"
)

// PublisherConfig configures a [Publisher]. Source and Targets are
// required, and a client for each kind the targets name (or KubeConfig to
// build it from); every other field has a default, used when it is left
// zero. [NewPublisher] validates it, and its errors name the offending
// field (such as "PublisherConfig.Targets[1].Selector").
type PublisherConfig struct {
	// Source provides the CA bundle to publish. Required. The publisher
	// registers itself as a listener, so a provider that notifies on change
	// gets its new bundle published at once; one that does not is still
	// picked up at the next resync. While the bundle is empty nothing is
	// written.
	Source dynamiccertificates.CAContentProvider

	// Targets lists the objects to write into. At least one is required.
	// Several targets may select the same object: the object then gets the
	// union of the fields they select.
	Targets []Target

	// KubeConfig is used to build the clients that are not given below.
	// It is copied, not modified.
	KubeConfig *rest.Config
	// KubeClient serves the webhook configuration kinds. When nil it is
	// built from KubeConfig if a target needs it.
	KubeClient kubernetes.Interface
	// APIExtensionsClient serves CustomResourceDefinitions. When nil it is
	// built from KubeConfig if a target needs it.
	APIExtensionsClient apiextensionsclient.Interface
	// AggregatorClient serves APIServices. When nil it is built from
	// KubeConfig if a target needs it.
	AggregatorClient aggregatorclient.Interface

	// Resync is the period at which every target is worked on even without
	// any event: a safety net for a provider that changes its bundle
	// without notifying its listeners, and for work lost in any other way.
	// The comparison is made against the informer cache (which the informer
	// keeps consistent by relisting whenever its watch fails), so an
	// up-to-date object costs no request. Zero means DefaultResync (one
	// minute); it must not be negative.
	Resync time.Duration

	// UseServerSideApply writes with server-side apply instead of a JSON
	// patch. The applied object holds only the caBundle fields and, for
	// webhook configurations, the name of each selected webhook, which is
	// the key of the webhooks list. The apply is not forced: a caBundle
	// that another field manager owns is a conflict, reported as contested,
	// and taken over with a forced apply only after the contested backoff
	// (see the package documentation). Note that co-owning the webhook
	// name key has the usual server-side-apply consequence: a webhook the
	// publisher writes into is not removed by another manager's apply that
	// omits it; remove the target first, or delete the webhook with an
	// update or JSON patch.
	UseServerSideApply bool

	// FieldManager is the field manager of every write, in both modes.
	// Empty means DefaultFieldManager ("evercert").
	FieldManager string

	// Name names the publisher as an observer of a CA rotation (its Name
	// method) and its health check. Empty means DefaultName ("cabundle").
	Name string

	// Clock drives every timer of the publisher: the resync ticker, the
	// retry and contested backoffs (through its work queue), and the
	// window in which repeated overwrites make an object contested. Nil
	// means the real clock. A test can pass a fake clock
	// (k8s.io/utils/clock/testing) and step it to drive retries. The
	// informers' own timers (watch restarts) stay on the real clock.
	Clock clock.WithTicker

	// Verify lists the certificate chains that the published bundle must
	// verify: what the servers behind the targets serve, such as
	// dynamiccert.ServedBy(the server's certificate provider). Whenever an
	// object is read back (every watch event and resync) and whenever a
	// lister that is a dynamiccertificates.Notifier notifies, each selected
	// field of each object is checked to verify each chain (x509 path to a
	// root of the field, at Clock's now; names and key usages are not
	// checked). A field that does not (wiped by a re-apply, or without the
	// CA a server's leaf comes from) sets evercert_cabundle_verified{kind,name}
	// to 0, counts evercert_cabundle_unverified_total, fails the health
	// check and sends a Warning Event CABundleUnverified once per episode
	// (Normal CABundleVerified when it verifies again). Empty means no
	// verification.
	Verify []dynamiccert.ServedChainLister

	// EventRecorder, when set, receives an Event on the object whose
	// caBundle is contested (Warning CABundleContested), forcibly taken
	// over with server-side apply (Warning CABundleForced), and no longer
	// contested (Normal CABundleUncontested), and whose published bundle
	// stops (Warning CABundleUnverified) and starts again (Normal
	// CABundleVerified) verifying what is served (see Verify). The object is given as an
	// ObjectReference, so the recorder's scheme need not know its kind.
	// Events of cluster-scoped objects land in namespace "default".
	EventRecorder events.EventRecorder
}

// withDefaults returns cfg with every zero field that has a default set to
// it.
func (cfg PublisherConfig) withDefaults() PublisherConfig {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.Resync == 0 {
		cfg.Resync = DefaultResync
	}
	if cfg.FieldManager == "" {
		cfg.FieldManager = DefaultFieldManager
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return cfg
}

// validate checks cfg before any client is built, so that a bad target is
// reported as such rather than as a missing client. Its errors name the
// offending field.
func (cfg *PublisherConfig) validate() error {
	if cfg.Source == nil {
		return errors.New("PublisherConfig.Source is required")
	}
	if len(cfg.Targets) == 0 {
		return errors.New("PublisherConfig.Targets is empty: at least one target is required")
	}
	if cfg.Resync < 0 {
		return fmt.Errorf("PublisherConfig.Resync must not be negative, got %v", cfg.Resync)
	}
	for i, v := range cfg.Verify {
		if v == nil {
			return fmt.Errorf("PublisherConfig.Verify[%d] is nil", i)
		}
	}
	for i, t := range cfg.Targets {
		if err := t.validate(fmt.Sprintf("PublisherConfig.Targets[%d]", i)); err != nil {
			return err
		}
	}
	return nil
}
