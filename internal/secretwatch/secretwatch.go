// Package secretwatch watches one Kubernetes Secret: what dynamiccert's
// Secret providers (SecretCertKey, SecretCA) and the authority package's
// Authority share. A Source runs an informer restricted to the one name,
// hands every Secret it delivers (nil: deleted) to Process, reports watch
// failures once per distinct failure (internal/certreport), keeps the
// informer's cache readable (Cache) and records when the watch last showed
// that cache current (DeliveredAt), so a reader can tell a quiet watch from
// a wedged one. With Rereads it also re-reads the Secret with a GET every
// Resync.
//
// See docs/architecture.md for how the packages fit together.
package secretwatch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/certreport"
)

// Config names the Secret a Source watches and how it reports.
type Config struct {
	// Name identifies the provider in logs and metrics. Default
	// "secret:<Namespace>/<SecretName>".
	Name string
	// Namespace and SecretName name the Secret. Both are required.
	Namespace, SecretName string
	// Client reads the Secret. Required.
	Client kubernetes.Interface
	// Resync is how often the Secret is re-read with a GET when the Source
	// Rereads. Required then.
	Resync time.Duration
	// Clock is used for Resync and DeliveredAt. Default clock.RealClock{}.
	Clock clock.WithTicker
	// EventRecorder receives a Warning Event for every distinct failure,
	// about EventObject. Optional.
	EventRecorder events.EventRecorder
	// EventObject is the object the Events are about. Default the Secret.
	EventObject runtime.Object
}

// Source is a watch on one Secret, once-per-distinct-error reporting, and
// the run loop.
type Source struct {
	// Config is the configuration with its defaults filled in.
	Config Config
	// Key is namespace/name, for messages.
	Key string
	// Report reports the Source's failures; its owner reports its own
	// load failures through it too, so that each distinct one is reported
	// once.
	Report *certreport.Reporter
	// Process handles a Secret (nil: deleted) and returns the load error.
	// Set it before Run or RunOnce.
	Process func(*corev1.Secret) error
	// Rereads: Run also re-reads the Secret with a GET every
	// Config.Resync (SecretCertKey, SecretCA).
	Rereads bool
	mu      sync.Mutex // serializes Process
	// Cache is the watch's cache of the Secret while Run runs, nil
	// otherwise: the Authority reads it instead of a GET per check.
	Cache atomic.Pointer[View]
	// WatchFailing: the watch reported an error and no event arrived
	// since, nor a list that showed what the cache holds (it backs off or
	// re-lists): the cache may be stale.
	WatchFailing atomic.Bool
	// delivered is when (UnixNano on Config.Clock; 0: never) the watch
	// last showed that its cache is current: a list that succeeded, or an
	// event or bookmark it delivered. An open watch that delivers nothing
	// (a wedged watch cache, a proxy) leaves it behind.
	delivered atomic.Int64
	// deliveries counts those deliveries, so a reader can tell one that
	// came after a failure of its own even on a clock that did not move.
	deliveries atomic.Uint64
	// handled counts the Secrets Process was called with, under mu: a
	// re-read's answer is loaded only if the watch handled nothing while
	// the GET was in flight, which would be as new at least.
	handled uint64
	// handledRV is the resourceVersion last handled, under mu.
	handledRV string
}

// View is the informer cache of one Source.
type View struct {
	Store  cache.Store
	Synced func() bool
}

// New validates cfg, fills in its defaults and returns a Source that has
// read nothing yet.
func New(cfg Config) (*Source, error) {
	switch {
	case cfg.Namespace == "" || cfg.SecretName == "":
		return nil, errors.New("secret source: namespace and name are required")
	case cfg.Client == nil:
		return nil, fmt.Errorf("secret source %s/%s: a client is required", cfg.Namespace, cfg.SecretName)
	}
	key := cfg.Namespace + "/" + cfg.SecretName
	if cfg.Name == "" {
		cfg.Name = "secret:" + key
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.EventObject == nil {
		cfg.EventObject = &corev1.ObjectReference{APIVersion: "v1", Kind: "Secret", Namespace: cfg.Namespace, Name: cfg.SecretName}
	}
	return &Source{Config: cfg, Key: key, Report: certreport.New(cfg.Name, cfg.EventRecorder, cfg.EventObject)}, nil
}

// Handle hands secret (nil: deleted) to Process as a watch event does,
// serialized with the watch and the re-reads: for a caller (a simulator)
// that delivers the Secret itself.
func (s *Source) Handle(secret *corev1.Secret) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.handleLocked(secret)
}

func (s *Source) handleLocked(secret *corev1.Secret) error {
	s.handled++
	s.handledRV = ""
	if secret != nil {
		s.handledRV = secret.ResourceVersion
	}
	return s.Process(secret)
}

// MarkDelivered records that the watch showed its cache current now.
func (s *Source) MarkDelivered() {
	s.delivered.Store(s.Config.Clock.Now().UnixNano())
	s.deliveries.Add(1)
}

// Deliveries counts the times the watch showed its cache current (lists that
// succeeded, events and bookmarks). Safe for concurrent use.
func (s *Source) Deliveries() uint64 { return s.deliveries.Load() }

// DeliveredAt returns when the watch last showed its cache current (zero:
// never).
func (s *Source) DeliveredAt() time.Time {
	if n := s.delivered.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// failed reports err and returns it.
func (s *Source) failed(err error) error {
	s.Report.Failed(err)
	return err
}

// RunOnce reads the Secret with a plain GET, so a caller can fail fast at
// start-up when it is missing or forbidden.
func (s *Source) RunOnce(ctx context.Context) error {
	secret, err := s.Config.Client.CoreV1().Secrets(s.Config.Namespace).Get(ctx, s.Config.SecretName, metav1.GetOptions{})
	if err != nil && ctx.Err() != nil {
		return ctx.Err() // cancelled by the caller, not a failure of the Secret
	}
	if err != nil {
		return s.failed(fmt.Errorf("reading secret %s: %w", s.Key, DescribeAPIError(err, ReadVerbs)))
	}
	return s.Handle(secret)
}

// Run watches the Secret until ctx is done. The watch is restricted to the
// one name, and handshakes never wait on the API: they are served from the
// content cached by Process.
func (s *Source) Run(ctx context.Context) {
	selector := fields.OneTermEqualSelector("metadata.name", s.Config.SecretName).String()
	secrets := s.Config.Client.CoreV1().Secrets(s.Config.Namespace)
	var store cache.Store // the informer's, set before it runs
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.FieldSelector = selector
			list, err := secrets.List(ctx, opts)
			if err == nil {
				s.MarkDelivered()
				s.listedAsCached(list, store)
			}
			return list, err
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = selector
			w, err := secrets.Watch(ctx, opts)
			if err != nil {
				return nil, err
			}
			return newDeliveryWatch(w, s.MarkDelivered), nil
		},
	}
	// Fake clients cannot stream a watch-list; this lets the reflector fall
	// back to list+watch for them, and changes nothing for real clients.
	// No informer resync: it only replays the cache, which a watch that
	// delivers nothing leaves as old as it is; the re-read below asks the
	// API server.
	informer := cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, s.Config.Client), &corev1.Secret{}, cache.SharedIndexInformerOptions{})
	_ = informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || ctx.Err() != nil {
			return // the server closed the watch (the reflector re-lists), or we are stopping
		}
		s.WatchFailing.Store(true)
		_ = s.failed(fmt.Errorf("watching secret %s: %w", s.Key, DescribeAPIError(err, ReadVerbs)))
	})
	onChange := func(obj any) {
		s.WatchFailing.Store(false)
		if secret, ok := obj.(*corev1.Secret); ok {
			_ = s.Handle(secret)
		}
	}
	_, _ = informer.AddEventHandlerWithOptions(cache.ResourceEventHandlerFuncs{
		AddFunc:    onChange,
		UpdateFunc: func(_, obj any) { onChange(obj) },
		DeleteFunc: func(any) {
			s.WatchFailing.Store(false)
			_ = s.Handle(nil)
		},
	}, cache.HandlerOptions{})
	store = informer.GetStore()
	view := &View{Store: store, Synced: informer.HasSynced}
	s.Cache.Store(view)
	defer s.Cache.CompareAndSwap(view, nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	if s.Rereads {
		wg.Go(func() { s.rereadEvery(ctx) })
	}
	informer.RunWithContext(ctx)
}

// listedAsCached clears WatchFailing when a list that succeeded shows what
// the cache holds. The watch handlers clear it when the list changes the
// cache or repeats the Secret, but a list without the Secret, into a cache
// without it, calls none: after a failed list (an API server still
// starting) the cache stayed "failing" until the Secret was created, and
// every read sent a GET, which RBAC may forbid while it allows list and
// watch. When the list and the cache differ (or the client sets no
// resourceVersions to tell), the handlers clear it once the cache holds
// what was listed, not before.
func (s *Source) listedAsCached(list *corev1.SecretList, store cache.Store) {
	var listed *corev1.Secret
	for i := range list.Items {
		if list.Items[i].Name == s.Config.SecretName {
			listed = &list.Items[i]
		}
	}
	obj, inCache, err := store.GetByKey(s.Key)
	if err != nil {
		return
	}
	cached, _ := obj.(*corev1.Secret)
	if listed == nil && !inCache || listed != nil && cached != nil && listed.ResourceVersion != "" && listed.ResourceVersion == cached.ResourceVersion {
		s.WatchFailing.Store(false)
	}
}

// rereadEvery re-reads the Secret every Config.Resync until ctx is done,
// and after a failure retries with backoff (internal/backoff, capped at
// Config.Resync), on Config.Clock. It is what makes Resync true when the
// watch stays open but delivers nothing: the informer would only replay its
// cache.
func (s *Source) rereadEvery(ctx context.Context) {
	retry := backoff.New(backoff.DefaultInitial, s.Config.Resync)
	wait := s.Config.Resync
	for {
		t := s.Config.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		err := s.reread(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			wait = retry.Next(err)
		default:
			retry.Reset()
			wait = s.Config.Resync
		}
	}
}

// reread GETs the Secret and loads it, unless the watch handled a Secret
// while the GET was in flight. A failed GET is reported (counted once per
// distinct failure) and returned; content that fails to load is reported
// by Process and is not a reason to retry sooner.
func (s *Source) reread(ctx context.Context) error {
	s.mu.Lock()
	before := s.handled
	s.mu.Unlock()
	secret, err := s.Config.Client.CoreV1().Secrets(s.Config.Namespace).Get(ctx, s.Config.SecretName, metav1.GetOptions{})
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case apierrors.IsNotFound(err):
		secret = nil // deleted: reported as a delete event is
	case err != nil:
		return s.failed(fmt.Errorf("re-reading secret %s: %w", s.Key, DescribeAPIError(err, ReadVerbs)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.handled != before {
		return nil // the watch delivered meanwhile: as new at least
	}
	if secret != nil && secret.ResourceVersion != s.handledRV {
		// A change the watch did not deliver (or has not yet): say so, a
		// wedged watch is otherwise invisible.
		klog.FromContext(ctx).Info("Secret changed without a watch event; loading it from a re-read", "provider", s.Config.Name, "secret", s.Key,
			"resourceVersion", secret.ResourceVersion, "lastDelivered", s.handledRV)
	}
	_ = s.handleLocked(secret)
	return nil
}

// deliveryWatch passes a watch's events on unchanged and calls delivered
// for each event or bookmark (not for an error): what a reader of the
// cache needs to tell a quiet watch (bookmarks arrive) from a wedged one
// (nothing does).
type deliveryWatch struct {
	watch.Interface
	out  chan watch.Event
	stop chan struct{}
	once sync.Once
}

func newDeliveryWatch(w watch.Interface, delivered func()) watch.Interface {
	d := &deliveryWatch{Interface: w, out: make(chan watch.Event), stop: make(chan struct{})}
	go func() {
		defer close(d.out)
		for ev := range w.ResultChan() {
			if ev.Type != watch.Error {
				delivered()
			}
			select {
			case d.out <- ev:
			case <-d.stop:
				return
			}
		}
	}()
	return d
}

func (d *deliveryWatch) ResultChan() <-chan watch.Event { return d.out }

func (d *deliveryWatch) Stop() {
	d.once.Do(func() { close(d.stop) })
	d.Interface.Stop()
}

// ReadVerbs are what every Secret source reads its Secret with.
const ReadVerbs = "get, list and watch on this Secret"

// DescribeAPIError turns the API errors a Secret source meets into messages
// an operator can act on; verbs are what RBAC must allow for the request
// that failed, so a denied create is not reported as a missing get.
func DescribeAPIError(err error, verbs string) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("not found: %w", err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("forbidden (RBAC must allow %s): %w", verbs, err)
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("unauthorized (check the client's credentials): %w", err)
	}
	return err
}
