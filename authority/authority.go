package authority

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certmetrics"
	"github.com/evercert/evercert/internal/errlog"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/secretwatch"
)

// Keys and annotations the Authority keeps in its CA Secret besides the
// kubernetes.io/tls keys (tls.crt/tls.key: the signing CA) and ca.crt (the
// bundle of every CA still valid).
const (
	// NextCertKey and NextKeyKey hold a successor CA that
	// is already in ca.crt but does not sign yet.
	NextCertKey = "next.crt"
	NextKeyKey  = "next.key"
	// NextSinceAnnotation records when the successor joined ca.crt
	// (RFC 3339), so every replica agrees when its minimum delay ends.
	NextSinceAnnotation = "evercert.io/next-ca-published-at"
	// KeyRefKey and NextKeyRefKey hold, with a CAKeys
	// source, the reference (CAKeySource.NewKey) to the key of the signing
	// CA and of the successor instead of tls.key and next.key, which are
	// then absent (tls.key is empty in a pre-created kubernetes.io/tls
	// Secret, whose type requires the key).
	KeyRefKey     = "tls.key-ref"
	NextKeyRefKey = "next.key-ref"
	// WrittenCAAnnotation is written with every write of the CA Secret the
	// Authority makes: the fingerprint (Fingerprint) of the signing CA it
	// wrote to tls.crt. In cert-manager's layout, which is the Authority's
	// own, it tells a peer's write (a recreated Secret, an emergency a
	// paused replica missed) from cert-manager's webhook still writing: that
	// one keeps the annotations and replaces tls.crt, so the fingerprint no
	// longer matches, and the other writer is held (foreignWriter).
	// Written whether or not replica announcements are on.
	WrittenCAAnnotation = "evercert.io/written-ca"
)

// PodNameEnv is the environment variable Config.ReplicaID
// defaults from: the pod's name, set from the downward API
// (fieldRef metadata.name).
const PodNameEnv = "POD_NAME"

// Config configures an Authority.
type Config struct {
	// Name identifies the provider in logs and metrics. Default
	// "authority:<Namespace>/<SecretName>".
	Name string
	// Namespace and SecretName name the CA Secret. Required.
	Namespace, SecretName string
	// Client reads and writes the Secret and the replica Leases. Required.
	// RBAC: get, list, watch, update on the Secret (resourceNames can limit
	// these), create on secrets in the namespace unless DisableCreate, and
	// get, list, watch, create, update on leases.coordination.k8s.io in the
	// namespace unless DisableReplicaAnnouncements, and delete there to
	// remove the Leases of replicas long gone and its own at shutdown
	// (without it they stay).
	Client kubernetes.Interface
	// DisableCreate makes the Authority wait for a pre-created Secret
	// instead of creating it. It says so once in the log, then waits quietly.
	DisableCreate bool
	// Hosts are the DNS names and IPs of the serving leaf, each as
	// ValidateHost accepts it. Required.
	Hosts []string
	// CommonName of the leaf. Default the first DNS name in Hosts.
	CommonName string
	// SNINames, when set, replace the leaf's names for SNI selection.
	SNINames []string
	// KeyTypes are the key types of this replica's leaves, one leaf per
	// type for the same names, renewed together; the first is served by
	// CurrentCertKeyContent, the others by Alternatives. Default
	// [ECDSAP256]. A new CA's key is of the first RSA type listed, if any,
	// else of the first type; a CA already in the Secret keeps its key. See
	// SelfSignedConfig.KeyTypes.
	KeyTypes []dynamiccert.KeyType
	// Lifetime and RenewBefore of the leaf. Default 7 days and Lifetime/3.
	Lifetime, RenewBefore time.Duration
	// CALifetime and CARenewBefore of each CA. Default 8*Lifetime and
	// CALifetime/3. Lifetimes are at most MaxLifetime, and Lifetime at most
	// MaxLifetime/8 while CALifetime is defaulted.
	CALifetime, CARenewBefore time.Duration
	// PropagationDelay is the minimum time a successor CA is in ca.crt
	// before it signs, for consumers evercert cannot observe. The successor
	// also waits for every Observer and every live replica. A replica that
	// saw the successor arrive measures the delay from then, on its own
	// clock, so clock skew never shortens it; a replica started after the
	// publication measures it from the publication time recorded in the
	// Secret (NextSinceAnnotation) plus twice SkewTolerance, and
	// announces the successor at once, so replicas restarted more often
	// than the delay (rollouts, crash loops) do not start it over. Default
	// (CARenewBefore-RenewBefore)/4.
	//
	// An emergency rotation (CompromisedCAAnnotation) skips it: the
	// successor of a compromised CA signs as soon as every Observer and
	// every live replica confirms it. A key an attacker may hold must stop
	// being trusted sooner than a consumer nobody observes is likely to
	// cause an outage by missing the successor; every consumer evercert
	// does observe is still waited for.
	PropagationDelay time.Duration
	// SkewTolerance is the clock skew tolerated between replicas and
	// clients. Default one hour, or RenewBefore/4 when shorter. See
	// SelfSignedConfig.SkewTolerance. A replica whose clock disagrees
	// beyond it with the Secret or with most live replicas does not write
	// the Secret (see Status().ClockSkew and the package documentation).
	SkewTolerance time.Duration
	// CheckInterval bounds the time between wall-clock checks. Default one
	// minute, or Lifetime/10 when shorter.
	CheckInterval time.Duration
	// Observers confirm that a published successor CA has reached the
	// consumers they stand for (see Observer and AddObserver).
	Observers []Observer
	// ReplicaID names this replica in its Lease and in Status. Default the
	// environment variable POD_NAME (PodNameEnv; set it from the downward
	// API, metadata.name), else the host name with a random suffix. A
	// stable ID lets a process restarted in the same pod (a crash, an OOM
	// kill) take over its own Lease at once, where a new ID leaves the old
	// process's Lease counted as a live replica, waited for, until it ages
	// out (LeaseDuration). Two processes running at the same time must not
	// share an ID.
	ReplicaID string
	// LeaseDuration is how long a replica's announcement counts as live
	// after this replica last saw it renewed, plus a margin for clocks
	// that drift or step (twice SkewTolerance, at most a third of it); replicas
	// renew every third of it. Default 3*CheckInterval, at least 15s.
	LeaseDuration time.Duration
	// DisableReplicaAnnouncements turns the replica Leases off: a successor
	// then waits only for the local Observers and PropagationDelay.
	DisableReplicaAnnouncements bool
	// EventRecorder receives, about EventObject, a Normal
	// CertificateRotated Event for every new leaf of this replica, a Warning
	// CertificateLoadFailed Event for every distinct failure to read or
	// write the CA state, a Warning UnsafeCARotation Event on an unsafe
	// rotation, and a Warning ClockSkew Event when this replica's clock
	// starts to disagree with the Secret or the other replicas. Optional.
	EventRecorder events.EventRecorder
	// EventObject is the object the Events are about, e.g. this replica's
	// Pod. Default the CA Secret.
	EventObject runtime.Object
	// Adopt, when set, takes over a CA Secret written by another rotator
	// in its layout (see SecretLayout): its CA stays trusted (and signs,
	// where its key is stored) until an observed rotation replaces it, and
	// the Secret is rewritten in the Authority's layout. Stop the other
	// tool first. Default LayoutEvercert: the Authority's own layout;
	// cert-manager's is the same and is read without Adopt too.
	Adopt SecretLayout
	// CAKeys, when set, keeps the CA private keys outside the Secret, e.g.
	// in an HSM (package github.com/evercert/evercert/pkcs11): every new
	// CA's key is made there, and the Secret holds only the certificates
	// and a reference to each key (KeyRefKey,
	// NextKeyRefKey). Every replica needs the same store. A CA
	// Secret that still holds a CA's key in tls.key (written before CAKeys
	// was set) keeps working: that CA keeps signing and a successor with a
	// key in the store is published at once, so the key in the Secret stops
	// signing after an observed rotation, not a disruptive one. An
	// Authority without CAKeys refuses a Secret holding a key reference.
	// Default nil: the keys are PEM in the Secret.
	CAKeys CAKeySource
	// CAKeyTimeout bounds every CAKeys call and every signature with one
	// of its keys, on Clock: a key store that stops answering fails the
	// check, which is retried with backoff while the last leaf keeps
	// serving. Default DefaultCAKeyTimeout.
	CAKeyTimeout time.Duration
	// Clock drives rotation and validity. Default clock.RealClock{}.
	Clock clock.WithTicker
}

func (c *Config) complete() error {
	switch {
	case c.Namespace == "" || c.SecretName == "":
		return errors.New("namespace and name of the CA secret are required")
	case c.Client == nil:
		return errors.New("a client is required")
	case len(c.Hosts) == 0:
		return errors.New("at least one host is required")
	}
	if err := c.Adopt.valid(); err != nil {
		return err
	}
	if c.Name == "" {
		c.Name = "authority:" + c.Namespace + "/" + c.SecretName
	}
	if c.Lifetime == 0 {
		c.Lifetime = 7 * 24 * time.Hour
	}
	if err := checkLifetimes(c.Lifetime, c.CALifetime, 8); err != nil {
		return err // before 8 × Lifetime overflows
	}
	if c.CALifetime == 0 {
		c.CALifetime = 8 * c.Lifetime
	}
	// The rotation schedule is the self-signed provider's; reuse its
	// defaults and checks so the two never drift apart.
	ss := SelfSignedConfig{
		Name: c.Name, CommonName: c.CommonName, Hosts: c.Hosts, KeyTypes: c.KeyTypes,
		Lifetime: c.Lifetime, RenewBefore: c.RenewBefore, CALifetime: c.CALifetime,
		CARenewBefore: c.CARenewBefore, PropagationDelay: c.PropagationDelay, SkewTolerance: c.SkewTolerance,
		CheckInterval: c.CheckInterval, Clock: c.Clock,
	}
	if err := ss.complete(); err != nil {
		return err
	}
	c.CommonName, c.KeyTypes, c.RenewBefore, c.CARenewBefore = ss.CommonName, ss.KeyTypes, ss.RenewBefore, ss.CARenewBefore
	c.PropagationDelay, c.SkewTolerance, c.CheckInterval, c.Clock = ss.PropagationDelay, ss.SkewTolerance, ss.CheckInterval, ss.Clock
	if c.ReplicaID == "" {
		c.ReplicaID = strings.TrimSpace(os.Getenv(PodNameEnv))
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = defaultReplicaID(host, uuid.NewString()[:8])
	}
	if c.LeaseDuration == 0 {
		c.LeaseDuration = max(3*c.CheckInterval, 15*time.Second)
	}
	if c.CAKeyTimeout == 0 {
		c.CAKeyTimeout = DefaultCAKeyTimeout
	}
	if c.LeaseDuration < time.Second {
		return fmt.Errorf("lease duration %v must be at least one second", c.LeaseDuration)
	}
	return nil
}

// Authority keeps a CA in a Kubernetes Secret, shared by every replica, and
// serves a leaf each replica makes in memory, signed by that CA. The CA key
// never leaves the Secret and the processes that use it; leaf keys never
// leave their process.
//
// CA rotation is observed (see the package documentation): a successor CA
// first joins ca.crt, signs only once PropagationDelay has passed (on each
// replica's own clock, from when it first saw the successor or, for a
// replica started later, from its recorded publication), every
// Observer confirmed it and every live replica announced (in its Lease)
// that it has loaded it; the old CA stays in ca.crt until it expires. Replicas converge with optimistic concurrency (resourceVersion):
// a write conflict means re-read and decide again, not an error. A replica
// never replaces a CA that is valid within the skew tolerance, so replicas
// whose clocks disagree by up to SkewTolerance do not undo each other's
// writes. Beyond the tolerance, one replica's clock never decides alone: a
// replica whose clock disagrees with the Secret (a CA not yet valid on it)
// or with most live replicas' Lease renewals writes nothing, issues no leaf
// and fails its readiness (Status().ClockSkew, RotationCheck), and only a
// CA expired for most live replicas is replaced. A replica that finds the
// Secret deleted, or rolled back to older content (an etcd restore), writes
// back the CAs it knows instead of starting a new CA that no client trusts.
//
// Authority implements dynamiccertificates.SNICertKeyContentProvider (the
// leaf), CAContentProvider (ca.crt) and ControllerRunner. It is safe for
// concurrent use.
type Authority struct {
	*issuer
	cfg   Config
	store *secretStore
	alts  []dynamiccertificates.SNICertKeyContentProvider
}

var (
	_ dynamiccertificates.SNICertKeyContentProvider = &Authority{}
	_ dynamiccertificates.CAContentProvider         = &Authority{}
	_ dynamiccertificates.ControllerRunner          = &Authority{}
)

// New validates cfg. The Authority has no content until RunOnce or
// Run has read (or created) the Secret.
func New(cfg Config) (*Authority, error) {
	if err := cfg.complete(); err != nil {
		return nil, fmt.Errorf("authority %s/%s: %w", cfg.Namespace, cfg.SecretName, err)
	}
	src, err := secretwatch.New(secretwatch.Config{
		Name: cfg.Name, Namespace: cfg.Namespace, SecretName: cfg.SecretName,
		Client: cfg.Client, Clock: cfg.Clock, EventRecorder: cfg.EventRecorder, EventObject: cfg.EventObject,
	})
	if err != nil {
		return nil, err
	}
	cfg.EventObject = src.Config.EventObject // the Secret by default
	keys := newCAKeys(cfg.CAKeys, cfg.CAKeyTimeout, cfg.Clock)
	secretRef := &corev1.ObjectReference{APIVersion: "v1", Kind: "Secret", Namespace: cfg.Namespace, Name: cfg.SecretName}
	store := &secretStore{cfg: &cfg, src: src, keys: keys, reads: newSecretReads(src, cfg.CheckInterval),
		repair: &secretRepair{name: cfg.Name, key: src.Key, report: newReporter(cfg.Name, cfg.EventRecorder, secretRef)}}
	if cfg.Adopt != LayoutEvercert {
		store.writer = &foreignWriter{name: cfg.Name, key: src.Key, layout: cfg.Adopt, quiet: backoff.New(cfg.CheckInterval, 10*cfg.CheckInterval),
			retireIn: cfg.Lifetime + cfg.CheckInterval,
			report:   newReporter(cfg.Name, cfg.EventRecorder, secretRef)}
	}
	a := &Authority{cfg: cfg, store: store}
	a.issuer = newIssuer(issuerConfig{
		name: cfg.Name, commonName: cfg.CommonName, hosts: cfg.Hosts, keyTypes: cfg.KeyTypes, lifetime: cfg.Lifetime,
		checkInterval: cfg.CheckInterval, clock: cfg.Clock, recorder: cfg.EventRecorder, eventObject: cfg.EventObject,
	}, rotation{
		name: cfg.Name, caKeyType: pki.KeyType(caKeyType(cfg.KeyTypes)),
		caLifetime: cfg.CALifetime, caRenewBefore: cfg.CARenewBefore,
		propagation: cfg.PropagationDelay, leafRenewBefore: cfg.RenewBefore,
		skew: cfg.SkewTolerance, caKeys: keys,
	}, store, cfg.Observers)
	a.alts = newAlternatives(a.issuer, cfg.SNINames)
	a.emerg = newEmergency(cfg.Name, a.sched, newReporter(cfg.Name, cfg.EventRecorder, secretRef), a.servingFrom)
	a.issuer.repair = store.repair
	a.issuer.writer = store.writer
	a.issuer.judge = func(st *caSet, now time.Time) (string, bool) {
		if a.replicas != nil {
			// Announced leaves must chain to a CA of the Secret as read.
			a.replicas.setRoots(st)
		}
		return a.clockSkew(st, now)
	}
	if !cfg.DisableReplicaAnnouncements {
		a.replicas = newReplicaSet(cfg.Client, cfg.Namespace, cfg.SecretName, cfg.ReplicaID, cfg.Name, cfg.LeaseDuration, cfg.SkewTolerance, cfg.Clock)
		store.reads.apiFailing = a.replicas.writeFailing.Load
		a.replicas.names = leafNames(a.issuer.cfg.dnsNames, a.issuer.cfg.ips)
		store.ownNames = a.replicas.names
		store.namesInUse = a.replicas.namesInUse
	}
	src.Process = func(secret *corev1.Secret) error {
		store.reads.observed(secret)
		src.Report.Succeeded() // an event arrived: the watch works
		a.Enqueue()
		return nil
	}
	return a, nil
}

// Name returns the provider name.
func (a *Authority) Name() string { return a.cfg.Name }

// Config returns the configuration with its defaults filled in, e.g. the
// CA schedule a podcert.Signer checks against the leaf lifetimes it must
// issue. The Observers and EventRecorder fields are shared, not copied.
func (a *Authority) Config() Config { return a.cfg }

// ReplicaID returns the name this replica announces itself under.
func (a *Authority) ReplicaID() string { return a.cfg.ReplicaID }

// SNINames returns the explicit SNI names, or nil.
func (a *Authority) SNINames() []string { return a.cfg.SNINames }

// Alternatives returns one provider per key type after the first in
// KeyTypes (none by default), each serving this replica's leaf of that type
// under the name "<Name>/<key type>"; see SelfSigned.Alternatives. The
// slice is the caller's.
func (a *Authority) Alternatives() []dynamiccertificates.SNICertKeyContentProvider {
	return slices.Clone(a.alts)
}

// AddObserver adds o to the observers a successor CA waits for.
func (a *Authority) AddObserver(o Observer) { a.addObserver(o) }

// Status returns where the CA rotation stands; see RotationStatus.
func (a *Authority) Status() RotationStatus {
	s := a.currentStatus()
	// Broken does not set Stalled: every replica started after the edit
	// reads the same Secret, so failing readiness on it would take all of
	// them out at once while each still serves a valid leaf. Stalled
	// follows the schedule, which turns it on before the CA's end.
	s.Broken = a.store.repair.reason()
	if s.Broken != "" && s.ClockSkew == "" {
		s.Phase = PhaseBroken
	}
	// A writer that keeps rewriting the Secret sets Stalled, but like
	// Broken it does not fail readiness while a valid leaf is served
	// (RotationCheck, foreignWriterOnly): it is an old rotator's pods that
	// a rolling update replaces only once the new pods are Ready.
	if s.ForeignWriter = a.store.writer.reason(); s.ForeignWriter != "" {
		s.foreignWriterOnly = !s.Stalled
		s.Stalled = true
		if s.ClockSkew == "" && s.Broken == "" {
			s.Phase = PhaseStalled
		}
	}
	return s
}

// CurrentCertKeyContent returns this replica's leaf, or nil, nil before the
// CA is known.
func (a *Authority) CurrentCertKeyContent() ([]byte, []byte) { return a.currentCertKey() }

// CurrentParsedCertKeyContent returns what CurrentCertKeyContent returns
// together with the leaf ready to serve, or nil, nil, nil before the CA is
// known. The sni controller serves it as is, without parsing the PEM.
func (a *Authority) CurrentParsedCertKeyContent() ([]byte, []byte, *tls.Certificate) {
	return a.currentParsedCertKey()
}

// CurrentCABundleContent returns ca.crt as last read from the Secret: every
// CA that is still valid, including a successor that does not sign yet.
func (a *Authority) CurrentCABundleContent() []byte { return a.currentBundle() }

// VerifyOptions verifies against the bundle; ok is false before it is known.
func (a *Authority) VerifyOptions() (x509.VerifyOptions, bool) { return a.verifyOptions() }

// Leaf returns this replica's leaf certificate, or nil.
func (a *Authority) Leaf() *x509.Certificate { return a.currentLeaf() }

// RenewAt returns when the leaf is due to be replaced (zero before the
// first leaf).
func (a *Authority) RenewAt() time.Time { return a.renewAt() }

// LastError returns the last reconcile error, nil after a successful
// reconcile. Watch errors are logged (each distinct one once) and counted;
// while the watch fails, decisions rest on the reconcile's own GET.
func (a *Authority) LastError() error { return a.report.lastError() }

// RunOnce reads the Secret (with a GET, unless Run's watch holds it
// current), creates or rotates the CA if due, and makes this replica's leaf.
func (a *Authority) RunOnce(ctx context.Context) error {
	_, err := a.check(ctx)
	return err
}

// Run follows the Secret, announces this replica and rotates until ctx is
// done; workers is ignored.
//
// A failed reconcile is retried with backoff (internal/backoff: exponential,
// jittered, capped, at least a 429's Retry-After) on the configured clock.
// While it backs off, watch events wait for the backoff to end, so a chatty
// watch cannot turn the retries into a hot loop; when healthy, an event
// reconciles at once.
func (a *Authority) Run(ctx context.Context, _ int) { a.run(ctx) }

// errWaitingForStore means the CA state does not exist yet and must not be
// created here (DisableCreate): not an error, checked again later.
var errWaitingForStore = errors.New("waiting for the CA state to be created")

// secretStore keeps an Authority's CA state in its Secret. It remembers the
// last state in force, with its keys, to restore a Secret that was deleted
// or rolled back.
type secretStore struct {
	cfg       *Config
	src       *secretwatch.Source
	keys      *caKeys      // nil: CA keys are PEM in the Secret
	reads     *secretReads // the watch's cache, or a GET (see secretReads)
	waiting   errlog.Once  // logs the wait for a pre-created Secret once
	recordLog errlog.Once  // logs a WrittenBundleAnnotation not used whole, once
	last      *caSet
	lastWrite string // resourceVersion of our last write, for logs
	// ownNames is this replica's leaf names, added to the Secret's
	// ReplicaNamesAnnotation when missing ("" without announcements).
	ownNames string
	// namesInUse reports whether a live replica announces a set of leaf
	// names (replicaSet.namesInUse); nil without announcements.
	namesInUse func(string) bool
	// repair handles a Secret edited by hand into content that cannot be
	// used as it is: written back, or reported (secretRepair).
	repair *secretRepair
	// writer tells the rotator adopted from still rewriting the Secret
	// (foreignWriter); nil without Config.Adopt.
	writer *foreignWriter
	// declaring logs, once per distinct error, a write of caBundle target
	// declarations that failed (stepResult.declarationOnly).
	declaring errlog.Once
	// unanswered is the unsafe rotation that a write sent but got no
	// answer for (a timeout, a 5xx): the write may have committed, and
	// then the next read finds the CA signing already and decides nothing,
	// so the rotation would go uncounted by the replica that made it
	// (simulator seed 599 with slow calls). The next step counts it if the
	// Secret holds the record this write sent (see countUnanswered).
	unanswered struct{ record, why string }
}

// mayHaveCommitted reports whether a write that returned err may still
// have been applied: a timeout, a 5xx or a lost connection, not an answer
// that refused it (4xx: forbidden, throttled, invalid), so that a peer's
// identical record is not taken for this write's (a review found a 429
// counted twice).
func mayHaveCommitted(err error) bool {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		code := status.Status().Code
		return code == 0 || code >= 500 || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err)
	}
	return true // no answer at all: a connection that broke
}

// countUnanswered counts, in res, the unsafe rotation of a write that got
// no answer once a read shows that it committed: the record it sent is the
// Secret's last one, to the second and the reason, and this step did not
// decide one itself (a write that did not commit is decided again, and
// counted then). It reports whether it counted it: the record is kept
// until this step's result is (answered), since a step that returns an
// error drops its result, and a conflict on this step's own write lost the
// count for good (a review found it).
func (s *secretStore) countUnanswered(res *stepResult) bool {
	u := s.unanswered
	if u.record == "" {
		return false
	}
	if res.unsafe || res.state == nil || res.state.unsafe.last != u.record {
		s.answered()
		return false
	}
	res.unsafe, res.unsafeWhy = true, u.why+" (counted once the Secret was read back: the write that made it sign got no answer)"
	return true
}

// answered forgets the unsafe rotation of a write that got no answer: it
// was counted, or a read showed the write did not commit.
func (s *secretStore) answered() { s.unanswered.record, s.unanswered.why = "", "" }

func (s *secretStore) run(ctx context.Context, _ func()) {
	// The watch kicks the issuer (src.Process) and is the cache update
	// reads from; it falls back to a GET when the cache may be stale (see
	// secretReads).
	s.src.Run(ctx)
}

func (s *secretStore) update(ctx context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error) {
	const attempts = 5
	var res stepResult
	var err error
	for range attempts {
		res, err = s.updateOnce(ctx, now, step)
		if !apierrors.IsConflict(err) && !apierrors.IsAlreadyExists(err) {
			return res, err
		}
		// Another replica wrote first: re-read and decide again.
		klog.FromContext(ctx).V(2).Info("CA secret changed underneath us; re-reading", "provider", s.cfg.Name)
	}
	return stepResult{}, err
}

// updateOnce reads the Secret, lets step decide, and writes what it
// decided: the I/O around one transition of the rotation (machine.step).
func (s *secretStore) updateOnce(ctx context.Context, now time.Time, step func(stepInput) (stepResult, error)) (stepResult, error) {
	// mayReference: the Secret may now reference the CA keys step made
	// in a key store; when it may not, they are deleted (caKeys.settle).
	mayReference := false
	defer func() { s.keys.settle(ctx, mayReference) }()
	secrets := s.cfg.Client.CoreV1().Secrets(s.cfg.Namespace)
	secret, err := s.reads.read(ctx, s.cfg.Namespace, s.cfg.SecretName)
	exists := err == nil
	switch {
	case apierrors.IsNotFound(err) && s.cfg.DisableCreate && s.last == nil:
		s.waiting.Info(klog.Background(), "waiting: secret missing", "Waiting for the CA secret to be created", "provider", s.cfg.Name, "secret", s.src.Key)
		return stepResult{}, errWaitingForStore
	case apierrors.IsNotFound(err):
		secret = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: s.cfg.Namespace, Name: s.cfg.SecretName},
			Type:       corev1.SecretTypeTLS,
		}
	case err != nil && ctx.Err() != nil:
		return stepResult{}, ctx.Err()
	case err != nil:
		return stepResult{}, fmt.Errorf("reading CA secret %s: %w", s.src.Key, secretwatch.DescribeAPIError(err, secretwatch.ReadVerbs))
	}
	st, convert, err := parseSecretLayout(secret, s.cfg.Adopt)
	// repairs say what a hand edit broke and this replica writes back
	// (secretRepair).
	var repairs []string
	var broken *brokenSecretError
	if errors.As(err, &broken) {
		var fixed []string
		if st, fixed, err = s.repair.fill(secret, err, broken, s.last, parseOperatorRequests(secret).compromised); err == nil {
			repairs = append(repairs, fmt.Sprintf("%s did not parse (%v): written back as this replica last held it", strings.Join(fixed, ", "), broken))
		}
	}
	if err == nil {
		err = s.keys.resolveKeys(st)
	}
	if err != nil {
		var unrepairable *unrepairableError
		if mutations.brokenSilent && errors.As(err, &unrepairable) {
			s.repair.setReason("")
			return stepResult{}, errWaitingForStore
		}
		return stepResult{}, fmt.Errorf("CA secret %s: %w", s.src.Key, err)
	}
	st.ops = parseOperatorRequests(secret)
	st.unsafe = parseUnsafeRecord(secret)
	st.retire = parseRetirements(secret)
	st.replicaNames = parseReplicaNames(secret)
	st.targets = parseDeclaredTargets(secret)
	st.recorded = s.recordedBundle(secret, st)
	s.writer.learnRecorded(secret, st)
	namesAdded := addReplicaNames(&st.replicaNames, s.ownNames, s.namesInUse)
	res, err := step(stepInput{now: now, read: st, exists: exists, last: s.last, adopted: convert, repairs: repairs, marks: evercertMarks(secret),
		written: secret.Annotations[WrittenCAAnnotation]})
	if convert && err == nil && res.skew == nil {
		// Logged once decided: not while another writer keeps rewriting
		// the Secret (foreignWriter), which is held instead.
		klog.FromContext(ctx).Info("Adopting the CA secret of another rotator; its CA stays trusted", "provider", s.cfg.Name, "secret", s.src.Key, "layout", string(s.cfg.Adopt))
	}
	var unrepairable *unrepairableError
	if mutations.brokenSilent && errors.As(err, &unrepairable) {
		s.repair.setReason("")
		return stepResult{}, errWaitingForStore
	}
	if err != nil {
		return res, fmt.Errorf("CA secret %s: %w", s.src.Key, err)
	}
	if res.skew != nil {
		// This clock is the suspect: nothing is restored, decided or
		// written; the state as read is what the replica serves.
		if len(res.repairs) > 0 {
			// A hand edit this replica would write back waits too. After
			// a pause the wait is for the peers' next renewals and not a
			// skew found (ClockSkew stays empty), and a peer paused or
			// killed meanwhile stretches it to its Lease's end: say it,
			// or a broken Secret goes unreported (simulator seed 15137,
			// V1).
			s.repair.setReason(fmt.Sprintf("a repair this replica holds waits until its clock is checked (%s): %s",
				res.skew.reason, strings.Join(res.repairs, "; ")))
		}
		last := st.clone()
		last.skewHeld = true
		s.last = &last
		return res, res.skew
	}
	certmetrics.ClockSkew(s.cfg.Name, false)
	counted := s.countUnanswered(&res)
	st = res.state
	if res.write || namesAdded {
		asRead := secret
		// The Update carries the resourceVersion read above: a Secret
		// written meanwhile (another replica, or the other tool still
		// running) is a conflict, re-read and decided again.
		updated := secret.DeepCopy()
		writeAuthoritySecret(st, updated, s.cfg.Adopt)
		s.writer.writeRecord(updated, st)
		if !exists && (st.signing.Key == nil || st.signing.KeyRef != "") {
			// A CA adopted without its key, written back after a delete,
			// or whose key is in a key store: a kubernetes.io/tls Secret
			// must hold tls.crt and tls.key.
			updated.Type = corev1.SecretTypeOpaque
		}
		if exists && updated.Type == corev1.SecretTypeTLS && st.signing.KeyRef != "" {
			updated.Data[corev1.TLSPrivateKeyKey] = []byte{} // required by the type, never the key
		}
		mayReference = true // sent: it may commit even if its answer is lost
		if !exists {
			secret, err = secrets.Create(ctx, updated, metav1.CreateOptions{})
		} else {
			secret, err = secrets.Update(ctx, updated, metav1.UpdateOptions{})
		}
		if err != nil {
			staleRV := ""
			if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
				staleRV = updated.ResourceVersion
				if !exists {
					staleRV = absentRV
				}
			}
			s.reads.failed(staleRV) // re-read with a GET
		}
		if err != nil && res.declarationOnly && ctx.Err() == nil {
			// Only the declaration was due: the state as read stays in
			// force, so this replica still adopts and announces it; the
			// renewal is tried again at the next check, well before the
			// declaration lapses (targetLapse).
			mayReference = false
			s.declaring.Error(klog.FromContext(ctx), fmt.Errorf("writing CA secret %s: %w", s.src.Key, secretwatch.DescribeAPIError(err, "update on this Secret")),
				"Could not renew this replica's caBundle target declaration in the CA secret; retried at the next check", "provider", s.cfg.Name)
			last := st.clone()
			s.last = &last
			if counted {
				s.answered()
			}
			return res, nil
		}
		if err == nil && res.declarationOnly {
			s.declaring.Recovered(klog.FromContext(ctx), "Renewed this replica's caBundle target declaration in the CA secret", "provider", s.cfg.Name)
		}
		if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
			mayReference = false // refused: nothing was written
			return stepResult{}, err
		}
		if err != nil && ctx.Err() != nil {
			return stepResult{}, ctx.Err()
		}
		if err != nil {
			if res.unsafe && mayHaveCommitted(err) && !counted {
				s.unanswered.record, s.unanswered.why = st.unsafe.last, res.unsafeWhy
			}
			verbs := "update on this Secret"
			if !exists {
				verbs = "create on secrets in the namespace, or pre-create the Secret and set DisableCreate"
			}
			return stepResult{}, fmt.Errorf("writing CA secret %s: %w", s.src.Key, secretwatch.DescribeAPIError(err, verbs))
		}
		s.lastWrite = secret.ResourceVersion
		s.reads.wrote(secret)
		if len(res.repairs) > 0 {
			s.repair.repaired(asRead, strings.Join(res.repairs, "; "))
		}
		klog.FromContext(ctx).V(2).Info("Wrote CA secret", "provider", s.cfg.Name, "secret", s.src.Key, "resourceVersion", secret.ResourceVersion,
			"signingSerial", serial(st.signing.Cert), "bundleSize", len(st.bundle), "restored", res.restored, "adopted", convert)
	}
	last := st.clone()
	s.last = &last
	if counted {
		s.answered()
	}
	s.writer.settled(now)
	return res, nil
}

// parseAuthoritySecret reads the CA side of the rotation state from the
// Secret; an empty Secret is an empty state. A Secret with a part that does
// not parse is a *brokenSecretError holding the parts that did.
func parseAuthoritySecret(s *corev1.Secret) (*caSet, error) {
	st := &caSet{}
	var signing error
	var err error
	if len(s.Data[KeyRefKey]) > 0 {
		if st.signing, err = parseCARef(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey], s.Data[KeyRefKey]); err != nil {
			signing = fmt.Errorf("signing CA (%s, %s): %w", corev1.TLSCertKey, KeyRefKey, err)
		}
	} else if len(s.Data[corev1.TLSCertKey]) > 0 || len(s.Data[corev1.TLSPrivateKeyKey]) > 0 {
		if st.signing, err = costly.parseCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]); err != nil {
			signing = fmt.Errorf("signing CA (%s, %s): %w", corev1.TLSCertKey, corev1.TLSPrivateKeyKey, err)
		}
	}
	err = parseSuccessorAndBundle(s, st)
	if err == nil && signing == nil {
		return st, nil
	}
	broken := &brokenSecretError{st: st}
	if err != nil {
		broken = err.(*brokenSecretError)
	}
	broken.signing = signing
	return nil, broken
}

// parseSuccessorAndBundle reads the published successor and the trusted
// bundle into st: evercert's keys, in every layout it adopts. A part that
// does not parse is left out of st and named in the *brokenSecretError
// returned.
func parseSuccessorAndBundle(s *corev1.Secret, st *caSet) error {
	broken := &brokenSecretError{st: st}
	var err error
	if len(s.Data[NextKeyRefKey]) > 0 {
		if st.next, err = parseCARef(s.Data[NextCertKey], s.Data[NextKeyKey], s.Data[NextKeyRefKey]); err != nil {
			broken.next = fmt.Errorf("successor CA (%s, %s): %w", NextCertKey, NextKeyRefKey, err)
		}
		st.nextSince = parseNextSince(s)
	} else if len(s.Data[NextCertKey]) > 0 {
		if st.next, err = costly.parseCA(s.Data[NextCertKey], s.Data[NextKeyKey]); err != nil {
			broken.next = fmt.Errorf("successor CA (%s, %s): %w", NextCertKey, NextKeyKey, err)
		}
		st.nextSince = parseNextSince(s)
	}
	if len(s.Data[dynamiccert.SecretCAKey]) > 0 {
		if st.bundle, err = costly.parseBundle(s.Data[dynamiccert.SecretCAKey]); err != nil {
			broken.bundle = fmt.Errorf("%s: %w", dynamiccert.SecretCAKey, err)
		}
	}
	if broken.next == nil && broken.bundle == nil {
		return nil
	}
	return broken
}

// parseNextSince reads the successor's publication time. A process
// started after the publication measures the minimum delay from it
// (rotation.delayStart): a stripped or garbled annotation leaves it
// unknown, the delay then runs from the process's own first sight, and
// must not stop the rotation.
func parseNextSince(s *corev1.Secret) time.Time {
	t, _ := time.Parse(time.RFC3339, s.Annotations[NextSinceAnnotation])
	return t
}

// parseCAPair parses a CA certificate and its key; the certificate must be
// a CA. Callers go through costly.parseCA.
func parseCAPair(certPEM, keyPEM []byte) (*pki.Issued, error) {
	pair, err := pki.ParseCertKey(certPEM, keyPEM, zeroTime)
	if err != nil {
		return nil, err
	}
	if !pair.Leaf.IsCA {
		return nil, errors.New("certificate is not a CA")
	}
	signer, ok := pair.TLS.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("unsupported private key type %T", pair.TLS.PrivateKey)
	}
	return &pki.Issued{Cert: pair.Leaf, Key: signer, CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// parseCARef parses a CA whose key is in a key store: its certificate and
// the reference; the key is found later (caKeys.resolveKeys). A key beside
// the reference is refused: the reference was meant to replace it. The
// certificate is parsed through costly.parseBundle, as every check reads
// it again, like the CAs parseCAPair parses.
func parseCARef(certPEM, keyPEM, ref []byte) (*pki.Issued, error) {
	if len(keyPEM) > 0 {
		return nil, errors.New("holds both a private key and a key reference; remove the private key")
	}
	certs, err := costly.parseBundle(certPEM)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 || !certs[0].IsCA {
		return nil, errors.New("certificate is not a single CA")
	}
	return &pki.Issued{Cert: certs[0], CertPEM: certPEM, KeyRef: string(ref)}, nil
}

// writeAuthoritySecret stores the state in the Secret: the signing CA as
// tls.crt and tls.key, the bundle as ca.crt, and a successor with its
// publication time. A signing CA adopted without its key (knative) is not
// written there: it and the other tool's leaf are written in the other
// tool's keys, where they were adopted from, so that the Secret reads back
// as the state in force also when it is written back after a delete or a
// rollback; once a CA with a key signs, the other tool's keys are removed
// (layout).
func writeAuthoritySecret(st *caSet, s *corev1.Secret, layout SecretLayout) {
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	switch {
	case st.signing.KeyRef != "":
		s.Data[corev1.TLSCertKey] = st.signing.CertPEM
		s.Data[KeyRefKey] = []byte(st.signing.KeyRef)
		delete(s.Data, corev1.TLSPrivateKeyKey) // the key of a CA before it, if any
		removeForeignKeys(s, layout)
	case st.signing.Key != nil:
		s.Data[corev1.TLSCertKey] = st.signing.CertPEM
		s.Data[corev1.TLSPrivateKeyKey] = st.signing.KeyPEM
		delete(s.Data, KeyRefKey)
		removeForeignKeys(s, layout)
	case st.legacy != nil:
		// A tls.crt would be read as the signing CA in force.
		delete(s.Data, corev1.TLSCertKey)
		delete(s.Data, corev1.TLSPrivateKeyKey)
		s.Data[knativeCACertKey] = st.signing.CertPEM
		s.Data[knativeServerCertKey] = st.legacy.CertPEM
		s.Data[knativeServerKeyKey] = st.legacy.KeyPEM
	}
	s.Data[dynamiccert.SecretCAKey], _ = st.bundlePEM()
	if s.Annotations == nil {
		s.Annotations = map[string]string{}
	}
	s.Annotations[WrittenCAAnnotation] = Fingerprint(st.signing.Cert)
	writeBundleRecord(s, layout)
	writeOperatorHandled(st.ops, s)
	st.unsafe.write(s)
	st.retire.write(s, st.bundle)
	writeReplicaNames(st.replicaNames, s)
	writeDeclaredTargets(st.targets, s)
	if st.next != nil {
		s.Data[NextCertKey] = st.next.CertPEM
		if st.next.KeyRef != "" {
			s.Data[NextKeyRefKey] = []byte(st.next.KeyRef)
			delete(s.Data, NextKeyKey)
		} else {
			s.Data[NextKeyKey] = st.next.KeyPEM
			delete(s.Data, NextKeyRefKey)
		}
		if s.Annotations == nil {
			s.Annotations = map[string]string{}
		}
		s.Annotations[NextSinceAnnotation] = st.nextSince.UTC().Format(time.RFC3339)
	} else {
		delete(s.Data, NextCertKey)
		delete(s.Data, NextKeyKey)
		delete(s.Data, NextKeyRefKey)
		delete(s.Annotations, NextSinceAnnotation)
	}
}
