package podcert

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apiserver/pkg/server/healthz"
	certinformersv1 "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
)

// Reasons of the Denied and Failed conditions the Signer writes, besides
// the API's own certificatesv1.PodCertificateRequestConditionUnsupportedKeyType
// and PodCertificateRequestConditionInvalidUserConfig.
const (
	// ReasonIssued is the reason of the Issued condition.
	ReasonIssued = "Issued"
	// ReasonNotAllowed: no Policy rule matches the pod's namespace and
	// service account.
	ReasonNotAllowed = "NotAllowed"
	// ReasonPodNotFound: the pod the request names does not exist.
	ReasonPodNotFound = "PodNotFound"
	// ReasonPodMismatch: the pod exists but has another UID, service
	// account or node than the request says.
	ReasonPodMismatch = "PodMismatch"
	// ReasonDNSNameNotAllowed: the pod asked (DNSNamesAnnotation) for a
	// name the Policy does not grant it.
	ReasonDNSNameNotAllowed = "DNSNameNotAllowed"
	// ReasonNoDNSNames: the Policy grants the pod no name, e.g. no Service
	// selects it yet.
	ReasonNoDNSNames = "NoDNSNames"
	// ReasonInvalidRequest: the request cannot be read (its CSR does not
	// parse, its maxExpirationSeconds is below the API's minimum).
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonSigningFailed: signing kept failing (Failed).
	ReasonSigningFailed = "SigningFailed"
	// ReasonStatusRejected: the API server kept refusing the issued status
	// as invalid, e.g. because this replica's clock is more than 5 minutes
	// off the API server's (Failed).
	ReasonStatusRejected = "StatusRejected"
)

// maxAttempts is how often signing, or writing the issued status, may fail
// for a reason that retrying cannot be expected to fix (not an API outage)
// before the request is marked Failed: the kubelet then reports it on the
// pod instead of waiting silently.
const maxAttempts = 3

// maxMessage bounds condition messages built from errors (the API allows
// 32768 bytes).
const maxMessage = 2048

// Signer signs the PodCertificateRequests addressed to one signer name
// (spec.signerName) with a CA, normally a authority.Authority, and
// through its rotations: every leaf comes from the CA that signs now, which
// the Authority promotes only once observed.
//
// For each open request it decides by the Policy: it reads the request's
// key from spec.stubPKCS10Request, reads the Pod (it must exist with the
// request's UID, service account and node) and, when a rule grants
// Service names, the Services of the namespace, and writes exactly one
// condition: Issued (with the leaf, notBefore, notAfter and
// beginRefreshAt), Denied with a reason, or Failed. Replicas may run side
// by side: the status is written with the resourceVersion the decision
// was made on, so only one write succeeds; a replica whose write conflicts
// reads the request again and, finding it decided, counts a conflict and
// moves on. A request that cannot be signed yet (no CA loaded, or the
// signing CA ends before MinLifetime while its successor waits to be
// observed) waits, and is retried when the CA changes.
//
// Lifetimes: min(maxExpirationSeconds, MaxLifetime), capped at the signing
// CA's NotAfter and never below MinLifetime; NotBefore is Backdate before
// signing; beginRefreshAt is at two thirds of the lifetime, at least 10
// minutes from either end, as the API requires.
//
// Methods are safe for concurrent use. Run may be called once.
type Signer struct {
	cfg      SignerConfig
	informer cache.SharedIndexInformer
	retry    *backoff.Items[string]
	queue    workqueue.TypedRateLimitingInterface[string]

	mu sync.Mutex
	// seen is when this replica first saw each open request, for the
	// latency metric.
	seen map[string]time.Time
	// waiting holds the open requests that wait for the CA, with the
	// reason (evercert_podcertificate_requests_waiting, HealthCheck).
	waiting map[string]string
	// finished holds the requests this replica decided, until the
	// informer delivers the decided version, so a stale cache never makes
	// it sign twice.
	finished map[string]struct{}
	// attempts counts the failures of each request that retrying may not
	// fix (see maxAttempts).
	attempts map[string]int
	// lastErr is each request's last error, logged once.
	lastErr map[string]string
}

// NewSigner validates cfg and builds a Signer. Nothing runs until Run; the
// Signer registers with cfg.CA to hear of CA changes.
func NewSigner(cfg SignerConfig) (*Signer, error) {
	if err := cfg.complete(); err != nil {
		return nil, fmt.Errorf("podcert signer %q: %w", cfg.SignerName, err)
	}
	s := &Signer{
		cfg:      cfg,
		retry:    backoff.NewItems[string](backoff.DefaultInitial, backoff.DefaultCap),
		seen:     map[string]time.Time{},
		waiting:  map[string]string{},
		finished: map[string]struct{}{},
		attempts: map[string]int{},
		lastErr:  map[string]string{},
	}
	s.queue = workqueue.NewTypedRateLimitingQueueWithConfig[string](s.retry, workqueue.TypedRateLimitingQueueConfig[string]{
		Name: "podcert:" + cfg.SignerName, Clock: cfg.Clock,
	})
	selector := fields.OneTermEqualSelector("spec.signerName", cfg.SignerName).String()
	s.informer = certinformersv1.NewFilteredPodCertificateRequestInformer(cfg.Client, metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.FieldSelector = selector })
	_, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    s.observe,
		UpdateFunc: func(_, obj any) { s.observe(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if pcr, ok := obj.(*certificatesv1.PodCertificateRequest); ok {
				s.forget(key(pcr), true)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("podcert signer %q: %w", cfg.SignerName, err)
	}
	cfg.CA.AddListener(caListener{s})
	return s, nil
}

// Run follows the requests and signs them with workers goroutines (at least
// one) until ctx is done, then returns once they stopped.
func (s *Signer) Run(ctx context.Context, workers int) {
	workers = max(workers, 1)
	certmetrics.PodCertificateSignerStarted(s.cfg.SignerName)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer s.queue.ShutDown()
	wg.Go(func() { s.informer.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return
	}
	klog.FromContext(ctx).Info("Signing PodCertificateRequests", "signer", s.cfg.SignerName, "ca", s.cfg.CA.Name(), "workers", workers)
	for range workers {
		wg.Go(func() {
			for s.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
}

// HasSynced reports whether the request informer has listed every request
// for the signer; until then Run signs nothing.
func (s *Signer) HasSynced() bool { return s.informer.HasSynced() }

// SignerName returns the signer name served.
func (s *Signer) SignerName() string { return s.cfg.SignerName }

// stopWaitingLocked drops k from the waiting requests; s.mu is held.
func (s *Signer) stopWaitingLocked(k string) {
	if _, ok := s.waiting[k]; ok {
		delete(s.waiting, k)
		certmetrics.PodCertificateWaiting(s.cfg.SignerName, len(s.waiting))
	}
}

// maxWaitingNamed bounds the requests HealthCheck names.
const maxWaitingNamed = 3

// HealthCheck returns the readiness check "podcert-waiting:<signer name>":
// it fails while any request waits for the CA (no signing CA yet, or the
// signing CA ends too soon for the request's lifetime while its successor
// waits to be observed), naming up to three of them with the reason, so a
// request that waits shows on /readyz and not only in one log line. The
// count is the gauge evercert_podcertificate_requests_waiting. A
// healthy rotation makes requests wait briefly when CARenewBefore is short
// (see CASchedule.LeafAlways).
func (s *Signer) HealthCheck() healthz.HealthChecker {
	return healthz.NamedCheck("podcert-waiting:"+s.cfg.SignerName, func(*http.Request) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.waiting) == 0 {
			return nil
		}
		keys := slices.Sorted(maps.Keys(s.waiting))
		named := make([]string, 0, maxWaitingNamed)
		for _, k := range keys[:min(len(keys), maxWaitingNamed)] {
			named = append(named, fmt.Sprintf("%s (%s)", k, s.waiting[k]))
		}
		more := ""
		if len(keys) > maxWaitingNamed {
			more = fmt.Sprintf(" and %d more", len(keys)-maxWaitingNamed)
		}
		return fmt.Errorf("signer %s: %d PodCertificateRequest(s) wait for the CA: %s%s", s.cfg.SignerName, len(keys), strings.Join(named, "; "), more)
	})
}

// Waiting returns the open requests that wait for the CA, as
// namespace/name, sorted.
func (s *Signer) Waiting() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Sorted(maps.Keys(s.waiting))
}

// caListener queues the requests waiting for the CA when it changes.
type caListener struct{ s *Signer }

func (l caListener) Enqueue() {
	l.s.mu.Lock()
	keys := make([]string, 0, len(l.s.waiting))
	for k := range l.s.waiting {
		keys = append(keys, k)
	}
	l.s.mu.Unlock()
	for _, k := range keys {
		l.s.queue.Add(k)
	}
}

func key(pcr *certificatesv1.PodCertificateRequest) string { return pcr.Namespace + "/" + pcr.Name }

// observe queues an open request, and forgets a decided one.
func (s *Signer) observe(obj any) {
	pcr, ok := obj.(*certificatesv1.PodCertificateRequest)
	if !ok {
		return
	}
	k := key(pcr)
	if final(pcr) {
		s.forget(k, true)
		return
	}
	s.mu.Lock()
	_, done := s.finished[k]
	if _, ok := s.seen[k]; !ok && !done {
		s.seen[k] = s.cfg.Clock.Now()
	}
	s.mu.Unlock()
	if !done {
		s.queue.Add(k)
	}
}

// forget drops what the Signer keeps about k; decided also drops the
// record that this replica decided it.
func (s *Signer) forget(k string, decided bool) {
	s.mu.Lock()
	delete(s.seen, k)
	s.stopWaitingLocked(k)
	delete(s.attempts, k)
	delete(s.lastErr, k)
	if decided {
		delete(s.finished, k)
	}
	s.mu.Unlock()
}

func final(pcr *certificatesv1.PodCertificateRequest) bool {
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certificatesv1.PodCertificateRequestConditionTypeIssued, certificatesv1.PodCertificateRequestConditionTypeDenied,
			certificatesv1.PodCertificateRequestConditionTypeFailed:
			return true
		}
	}
	return false
}

// processNext handles one request; false once the queue is shut down.
func (s *Signer) processNext(ctx context.Context) bool {
	k, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(k)
	wait, err := s.sync(ctx, k)
	switch {
	case ctx.Err() != nil:
	case err != nil:
		delay := s.retry.NextFor(k, err)
		// Each distinct error of a request is logged once; repeats (an API
		// outage retried with backoff) only verbosely.
		s.mu.Lock()
		repeat := s.lastErr[k] == err.Error()
		s.lastErr[k] = err.Error()
		s.mu.Unlock()
		if !repeat {
			klog.FromContext(ctx).Error(err, "PodCertificateRequest not decided yet; retrying with backoff", "request", k, "signer", s.cfg.SignerName, "retryIn", delay)
		} else {
			klog.FromContext(ctx).V(2).Info("PodCertificateRequest still not decided; retrying with backoff", "request", k, "signer", s.cfg.SignerName, "err", err, "retryIn", delay)
		}
		s.queue.AddAfter(k, delay)
	case wait:
		// The CA listener queues it as soon as the CA changes; the backoff
		// is the fallback.
		s.queue.AddAfter(k, s.retry.NextFor(k, nil))
	default:
		s.queue.Forget(k)
	}
	return true
}

// decision is what the Policy says about a request: a denial, or the key,
// names and lifetime of the leaf to issue.
type decision struct {
	reason, message string // a denial when reason is set
	pub             crypto.PublicKey
	names           []string
	lifetime        time.Duration
}

func deny(reason, format string, args ...any) decision {
	return decision{reason: reason, message: fmt.Sprintf(format, args...)}
}

// sync decides request k and writes its status. wait reports a request that
// waits for the CA; err one to retry with backoff.
func (s *Signer) sync(ctx context.Context, k string) (wait bool, err error) {
	obj, exists, err := s.informer.GetIndexer().GetByKey(k)
	if err != nil {
		return false, fmt.Errorf("reading PodCertificateRequest %s from the informer cache: %w", k, err)
	}
	if !exists {
		s.forget(k, false)
		return false, nil
	}
	pcr := obj.(*certificatesv1.PodCertificateRequest)
	s.mu.Lock()
	_, done := s.finished[k]
	s.mu.Unlock()
	if done || final(pcr) || pcr.Spec.SignerName != s.cfg.SignerName {
		return false, nil
	}
	d, err := s.decide(ctx, pcr)
	if err != nil {
		return false, err
	}
	now := s.cfg.Clock.Now()
	if d.reason != "" {
		return s.write(ctx, pcr, condition(certificatesv1.PodCertificateRequestConditionTypeDenied, d.reason, d.message, now), certmetrics.PodCertificateDenied)
	}
	var commonName string
	if len(d.names[0]) <= 64 { // the X.509 upper bound of a common name
		commonName = d.names[0]
	}
	leaf, err := s.cfg.CA.SignLeaf(authority.LeafRequest{
		PublicKey: d.pub, CommonName: commonName, DNSNames: d.names,
		Lifetime: d.lifetime, MinLifetime: MinLifetime, Backdate: s.cfg.Backdate,
	})
	var tooSoon *authority.CAEndsTooSoonError
	switch {
	case errors.Is(err, authority.ErrNoSigningCA) || errors.As(err, &tooSoon):
		s.mu.Lock()
		_, already := s.waiting[k]
		s.waiting[k] = err.Error()
		certmetrics.PodCertificateWaiting(s.cfg.SignerName, len(s.waiting))
		s.mu.Unlock()
		if !already {
			klog.FromContext(ctx).Info("PodCertificateRequest waits for the CA", "request", k, "signer", s.cfg.SignerName, "reason", err.Error())
		}
		return true, nil
	case err != nil:
		return s.failing(ctx, pcr, ReasonSigningFailed, fmt.Errorf("signing with %s: %w", s.cfg.CA.Name(), err))
	}
	s.mu.Lock()
	s.stopWaitingLocked(k)
	s.mu.Unlock()
	st := condition(certificatesv1.PodCertificateRequestConditionTypeIssued, ReasonIssued,
		fmt.Sprintf("issued by %s with CA %q (serial %s) for %s", s.cfg.SignerName, leaf.CA.Subject.CommonName,
			leaf.CA.SerialNumber.Text(16), strings.Join(d.names, ", ")), now)
	st.CertificateChain = string(leaf.CertPEM)
	st.NotBefore = &metav1.Time{Time: leaf.Cert.NotBefore}
	st.NotAfter = &metav1.Time{Time: leaf.Cert.NotAfter}
	st.BeginRefreshAt = &metav1.Time{Time: beginRefreshAt(leaf.Cert)}
	return s.write(ctx, pcr, st, certmetrics.PodCertificateIssued)
}

// beginRefreshAt is two thirds into the leaf's life, at whole seconds, and
// at least refreshMargin from either end (the API's rule).
func beginRefreshAt(leaf *x509.Certificate) time.Time {
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	at := leaf.NotBefore.Add(life * 2 / 3).Truncate(time.Second)
	if lo := leaf.NotBefore.Add(refreshMargin); at.Before(lo) {
		at = lo
	}
	if hi := leaf.NotAfter.Add(-refreshMargin); at.After(hi) {
		at = hi
	}
	return at
}

func condition(typ, reason, message string, now time.Time) certificatesv1.PodCertificateRequestStatus {
	if len(message) > maxMessage {
		message = message[:maxMessage] + "..."
	}
	return certificatesv1.PodCertificateRequestStatus{Conditions: []metav1.Condition{{
		Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: message,
		LastTransitionTime: metav1.NewTime(now),
	}}}
}

// decide applies the Policy. An error means it could not be decided now
// (the Pod or the Services could not be read).
func (s *Signer) decide(ctx context.Context, pcr *certificatesv1.PodCertificateRequest) (decision, error) {
	spec := pcr.Spec
	csr, err := x509.ParseCertificateRequest(spec.StubPKCS10Request)
	if err != nil {
		return deny(ReasonInvalidRequest, "spec.stubPKCS10Request does not parse: %v", err), nil
	}
	if kt := keyTypeOf(csr.PublicKey); !slices.Contains(s.cfg.KeyTypes, kt) {
		return deny(certificatesv1.PodCertificateRequestConditionUnsupportedKeyType,
			"key type %s is not supported by signer %s; use one of %s", kt, s.cfg.SignerName, strings.Join(s.cfg.KeyTypes, ", ")), nil
	}
	requested, err := requestedNames(spec.UnverifiedUserAnnotations)
	if err != nil {
		return deny(certificatesv1.PodCertificateRequestConditionInvalidUserConfig, "%v", err), nil
	}
	maxExp := DefaultMaxExpiration
	if spec.MaxExpirationSeconds != nil {
		maxExp = time.Duration(*spec.MaxExpirationSeconds) * time.Second
	}
	lifetime := min(maxExp, s.cfg.MaxLifetime)
	if lifetime < MinLifetime {
		return deny(ReasonInvalidRequest, "spec.maxExpirationSeconds %d is below the API's minimum of %d", int64(maxExp/time.Second), int64(MinLifetime/time.Second)), nil
	}
	rules := s.cfg.Policy.matching(pcr.Namespace, spec.ServiceAccountName)
	if len(rules) == 0 {
		return deny(ReasonNotAllowed, "no rule of signer %s allows service account %q in namespace %q", s.cfg.SignerName, spec.ServiceAccountName, pcr.Namespace), nil
	}

	pod, err := s.cfg.Client.CoreV1().Pods(pcr.Namespace).Get(ctx, spec.PodName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return deny(ReasonPodNotFound, "pod %s/%s does not exist", pcr.Namespace, spec.PodName), nil
	case err != nil:
		return decision{}, fmt.Errorf("reading pod %s/%s: %w", pcr.Namespace, spec.PodName, forbiddenHint(err, "get on pods"))
	case pod.UID != spec.PodUID:
		return deny(ReasonPodMismatch, "pod %s/%s has UID %s, the request names UID %s", pcr.Namespace, spec.PodName, pod.UID, spec.PodUID), nil
	case pod.Spec.ServiceAccountName != spec.ServiceAccountName:
		return deny(ReasonPodMismatch, "pod %s/%s runs as service account %q, the request names %q", pcr.Namespace, spec.PodName, pod.Spec.ServiceAccountName, spec.ServiceAccountName), nil
	case string(spec.NodeName) != pod.Spec.NodeName:
		return deny(ReasonPodMismatch, "pod %s/%s is on node %q, the request names node %q", pcr.Namespace, spec.PodName, pod.Spec.NodeName, spec.NodeName), nil
	}

	var granted []string
	wantServices := false
	for _, r := range rules {
		granted = append(granted, r.DNSNames...)
		wantServices = wantServices || r.ServiceNames
	}
	if wantServices {
		svcs, err := s.cfg.Client.CoreV1().Services(pcr.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			return decision{}, fmt.Errorf("listing services in %s: %w", pcr.Namespace, forbiddenHint(err, "list on services"))
		}
		granted = append(granted, serviceNames(pod, svcs.Items, s.cfg.Policy.clusterDomain())...)
	}
	names := granted
	if requested != nil {
		for _, n := range requested {
			if !slices.Contains(granted, n) {
				return deny(ReasonDNSNameNotAllowed, "DNS name %q (%s) is not granted to service account %q in namespace %q by signer %s; granted: %s",
					n, DNSNamesAnnotation, spec.ServiceAccountName, pcr.Namespace, s.cfg.SignerName, strings.Join(sortedUnique(granted), ", ")), nil
			}
		}
		names = requested
	}
	names = sortedUnique(names)
	if len(names) == 0 {
		return deny(ReasonNoDNSNames, "signer %s grants pod %s/%s no DNS name: no Service selects it and no rule lists names", s.cfg.SignerName, pcr.Namespace, spec.PodName), nil
	}
	return decision{pub: csr.PublicKey, names: names, lifetime: lifetime}, nil
}

var pemBlock = regexp.MustCompile(`-----BEGIN [A-Z0-9 ]+-----[\s\S]*?-----END [A-Z0-9 ]+-----`)

// redactPEM replaces every PEM block in s.
func redactPEM(s string) string { return pemBlock.ReplaceAllString(s, "<PEM redacted>") }

func sortedUnique(names []string) []string {
	out := slices.Clone(names)
	slices.Sort(out)
	return slices.Compact(out)
}

func forbiddenHint(err error, verb string) error {
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("forbidden (RBAC must allow %s; see example/signer/rbac.yaml): %w", verb, err)
	}
	return err
}

// failing records a failure retrying may not fix: it is retried with
// backoff until it happened maxAttempts times, then the request is Failed.
func (s *Signer) failing(ctx context.Context, pcr *certificatesv1.PodCertificateRequest, reason string, err error) (bool, error) {
	k := key(pcr)
	s.mu.Lock()
	s.attempts[k]++
	n := s.attempts[k]
	s.mu.Unlock()
	if n < maxAttempts {
		return false, err
	}
	st := condition(certificatesv1.PodCertificateRequestConditionTypeFailed, reason,
		fmt.Sprintf("signer %s gave up after %d attempts: %v", s.cfg.SignerName, n, err), s.cfg.Clock.Now())
	return s.write(ctx, pcr, st, certmetrics.PodCertificateFailed)
}

// write stores the decided status with the resourceVersion it was decided
// on. A conflict means the request changed: read it again; decided by
// someone else, it is done (a conflict, not an error).
func (s *Signer) write(ctx context.Context, pcr *certificatesv1.PodCertificateRequest, st certificatesv1.PodCertificateRequestStatus, result string) (bool, error) {
	k := key(pcr)
	upd := pcr.DeepCopy()
	upd.Status = st
	requests := s.cfg.Client.CertificatesV1().PodCertificateRequests(pcr.Namespace)
	_, err := requests.UpdateStatus(ctx, upd, metav1.UpdateOptions{})
	switch {
	case err == nil:
		s.finish(pcr, st, result)
		return false, nil
	case apierrors.IsNotFound(err):
		s.forget(k, false)
		return false, nil
	case apierrors.IsConflict(err):
		cur, gerr := requests.Get(ctx, pcr.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(gerr):
			s.forget(k, false)
			return false, nil
		case gerr != nil:
			return false, fmt.Errorf("reading PodCertificateRequest %s after a conflict: %w", k, gerr)
		case final(cur):
			klog.FromContext(ctx).V(2).Info("PodCertificateRequest decided by another replica", "request", k, "signer", s.cfg.SignerName)
			s.finish(pcr, cur.Status, certmetrics.PodCertificateConflict)
			return false, nil
		}
		return false, err // changed but still open: decide again on the new version
	case apierrors.IsInvalid(err) && result == certmetrics.PodCertificateIssued:
		// The API's message may quote the chain: keep PEM out of logs and
		// conditions.
		return s.failing(ctx, pcr, ReasonStatusRejected, fmt.Errorf("the API server refused the issued status: %s", redactPEM(err.Error())))
	}
	return false, fmt.Errorf("writing the status of PodCertificateRequest %s: %w", k,
		forbiddenHint(err, "update on podcertificaterequests/status and sign on signers "+s.cfg.SignerName))
}

// finish records a decided request: metrics, log, Event.
func (s *Signer) finish(pcr *certificatesv1.PodCertificateRequest, st certificatesv1.PodCertificateRequestStatus, result string) {
	k := key(pcr)
	now := s.cfg.Clock.Now()
	s.mu.Lock()
	first, ok := s.seen[k]
	if !ok {
		first = now
	}
	delete(s.seen, k)
	s.stopWaitingLocked(k)
	delete(s.attempts, k)
	delete(s.lastErr, k)
	s.finished[k] = struct{}{}
	s.mu.Unlock()
	certmetrics.PodCertificateRequestDone(s.cfg.SignerName, result, now.Sub(first))
	if result == certmetrics.PodCertificateConflict {
		return
	}
	c := st.Conditions[0]
	kv := []any{"request", k, "signer", s.cfg.SignerName, "pod", klog.KRef(pcr.Namespace, pcr.Spec.PodName),
		"serviceAccount", pcr.Spec.ServiceAccountName, "node", pcr.Spec.NodeName, "reason", c.Reason, "message", c.Message}
	if st.NotAfter != nil {
		kv = append(kv, "notBefore", st.NotBefore.UTC(), "notAfter", st.NotAfter.UTC(), "beginRefreshAt", st.BeginRefreshAt.UTC())
	}
	klog.Background().Info("PodCertificateRequest "+strings.ToLower(c.Type), kv...)
	if s.cfg.EventRecorder != nil && result != certmetrics.PodCertificateIssued {
		action := "Deny"
		if result == certmetrics.PodCertificateFailed {
			action = "Fail"
		}
		s.cfg.EventRecorder.Eventf(pcr, nil, corev1.EventTypeWarning, c.Reason, action, "%s", c.Message)
	}
}
