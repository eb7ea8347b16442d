package cabundle

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	certificatesinformers "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/notify"
	"github.com/evercert/evercert/internal/pki"
)

// This file holds the reverse of the ClusterTrustBundle kind: a CA source
// that reads the ClusterTrustBundles of a signer, such as the bundle a
// platform signer (a PodCertificateRequest signer) publishes, so that a
// Publisher can copy it into caBundle fields.

// ClusterTrustBundleSource is a dynamiccertificates.CAContentProvider whose
// bundle is the union of the ClusterTrustBundles of one signer: every CA
// certificate of every bundle whose spec.signerName is the signer, each
// once, ordered by bundle name and then by position in the bundle, so the
// content is stable however the API server orders the list. It is what the
// kubelet's clusterTrustBundle projected volume merges, without the
// shuffle. Use it as PublisherConfig.Source to keep a webhook's caBundle
// equal to what a signer publishes.
//
// Create it with [NewClusterTrustBundleSource] and start it with Run; its
// bundle is empty until the first list. Listeners are notified whenever
// the bundle changes. A bundle that does not parse (the API server
// validates them, so only a bug or an older server) is left out, logged
// once naming it, and counted in evercert_certificate_load_errors_total;
// the others are still served. Its methods are safe for concurrent use.
type ClusterTrustBundleSource struct {
	signerName string
	name       string
	informer   cache.SharedIndexInformer

	listeners notify.Listeners
	logs      errlog.ByKey

	mu      sync.RWMutex
	bundle  []byte
	started bool
}

var _ dynamiccertificates.CAContentProvider = (*ClusterTrustBundleSource)(nil)

// NewClusterTrustBundleSource returns the source of the ClusterTrustBundles
// of signerName, read with client (which needs get, list and watch on
// clustertrustbundles). It does nothing until Run.
func NewClusterTrustBundleSource(client kubernetes.Interface, signerName string) (*ClusterTrustBundleSource, error) {
	if client == nil {
		return nil, errors.New("cabundle: NewClusterTrustBundleSource: client is nil")
	}
	if signerName == "" {
		return nil, errors.New("cabundle: NewClusterTrustBundleSource: signerName is empty")
	}
	sel := fields.OneTermEqualSelector("spec.signerName", signerName).String()
	s := &ClusterTrustBundleSource{
		signerName: signerName,
		name:       "clustertrustbundles/" + signerName,
		informer: certificatesinformers.NewFilteredClusterTrustBundleInformer(client, 0, cache.Indexers{},
			func(o *metav1.ListOptions) { o.FieldSelector = sel }),
	}
	if err := s.informer.SetTransform(trimmed[certificatesv1.ClusterTrustBundle]); err != nil {
		return nil, fmt.Errorf("cabundle: ClusterTrustBundle source of %s: set informer transform: %w", signerName, err)
	}
	return s, nil
}

// Run watches the signer's bundles until ctx is done and returns once its
// informer stopped. There is one watch, so workers is ignored. It may be
// called only once: a second call logs an error and returns at once.
// Logging uses klog.FromContext(ctx).
func (s *ClusterTrustBundleSource) Run(ctx context.Context, workers int) {
	logger := klog.FromContext(ctx).WithName("clustertrustbundle-source").WithValues("signer", s.signerName)
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		logger.Error(nil, "cabundle: ClusterTrustBundleSource.Run called more than once; this call does nothing")
		return
	}
	s.started = true
	s.mu.Unlock()
	recompute := func(any) { s.recompute(logger) }
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    recompute,
		UpdateFunc: func(_, n any) { recompute(n) },
		DeleteFunc: recompute,
	}); err != nil {
		// Only a stopped informer refuses a handler, and this one has not
		// run yet.
		logger.Error(err, "cabundle: ClusterTrustBundle source: adding the event handler failed")
		return
	}
	s.informer.RunWithContext(ctx)
}

// HasSynced reports whether the first list has been merged.
func (s *ClusterTrustBundleSource) HasSynced() bool { return s.informer.HasSynced() }

// Name returns "clustertrustbundles/<signer name>".
func (s *ClusterTrustBundleSource) Name() string { return s.name }

// CurrentCABundleContent returns the merged PEM bundle, empty before the
// first list or while the signer has no bundle.
func (s *ClusterTrustBundleSource) CurrentCABundleContent() []byte {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.bundle
}

// VerifyOptions returns options that verify against the merged bundle
// (server authentication); ok is false while it is empty.
func (s *ClusterTrustBundleSource) VerifyOptions() (x509.VerifyOptions, bool) {
	pool, certs, err := pki.NewPool(s.CurrentCABundleContent())
	if err != nil || len(certs) == 0 {
		return x509.VerifyOptions{}, false
	}
	return x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, true
}

// AddListener registers l to be notified when the bundle changes.
func (s *ClusterTrustBundleSource) AddListener(l dynamiccertificates.Listener) { s.listeners.Add(l) }

// recompute merges the cached bundles and notifies the listeners when the
// result changed. Event handlers of one informer are never called
// concurrently, so recompute is never concurrent with itself.
func (s *ClusterTrustBundleSource) recompute(logger klog.Logger) {
	var objs []*certificatesv1.ClusterTrustBundle
	for _, o := range s.informer.GetStore().List() {
		if c, ok := o.(*certificatesv1.ClusterTrustBundle); ok && c.Spec.SignerName == s.signerName {
			objs = append(objs, c)
		}
	}
	slices.SortFunc(objs, func(a, b *certificatesv1.ClusterTrustBundle) int { return strings.Compare(a.Name, b.Name) })
	var out bytes.Buffer
	seen := map[string]bool{}
	for _, o := range objs {
		certs, err := pki.ParseCABundle([]byte(o.Spec.TrustBundle))
		if err != nil {
			if s.logs.Get(o.Name).Error(logger, fmt.Errorf("ClusterTrustBundle %q: %w", o.Name, err),
				"Leaving an unparsable ClusterTrustBundle out of the merged bundle", "clusterTrustBundle", o.Name) {
				certmetrics.LoadError(s.name)
			}
			continue
		}
		s.logs.Get(o.Name).Recovered(logger, "ClusterTrustBundle parses again", "clusterTrustBundle", o.Name)
		for _, c := range certs {
			if seen[string(c.Raw)] {
				continue
			}
			seen[string(c.Raw)] = true
			_ = pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
	}
	s.mu.Lock()
	changed := !bytes.Equal(s.bundle, out.Bytes())
	if changed {
		s.bundle = out.Bytes()
	}
	s.mu.Unlock()
	if changed {
		logger.Info("Merged bundle of the signer's ClusterTrustBundles changed", "bundles", len(objs), "certificates", len(seen))
		s.listeners.Notify()
	}
}
