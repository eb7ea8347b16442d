package app

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/cabundle"
	certv1alpha1 "github.com/evercert/evercert/example/apiserver/apis/certificates/v1alpha1"
	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/errlog"
)

// Registration settings of the APIService.
const (
	// APIServiceName is the name of the APIService the server registers.
	APIServiceName = "v1alpha1." + certv1alpha1.GroupName
	// APIServiceGroupPriorityMinimum is its spec.groupPriorityMinimum.
	APIServiceGroupPriorityMinimum = 1000
	// APIServiceVersionPriority is its spec.versionPriority.
	APIServiceVersionPriority = 15
	// RegistrationHookName is the post-start hook that registers the
	// APIService and starts the caBundle publisher.
	RegistrationHookName = "evercert-apiservice-registration"
)

// Backoff of registration retries (API server down, RBAC missing, ...):
// doubling from the base to the max delay, with jitter, and at least a
// 429's Retry-After (internal/backoff).
const (
	registrationBaseDelay = 200 * time.Millisecond
	registrationMaxDelay  = 30 * time.Second
)

// DesiredAPIService returns the APIService the server registers for the
// Service namespace/name and port, with caBundle set to bundle. It never sets
// insecureSkipTLSVerify.
func DesiredAPIService(namespace, name string, port int32, bundle []byte) *apiregistrationv1.APIService {
	return &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: APIServiceName},
		Spec: apiregistrationv1.APIServiceSpec{
			Service:              &apiregistrationv1.ServiceReference{Namespace: namespace, Name: name, Port: &port},
			Group:                certv1alpha1.GroupName,
			Version:              certv1alpha1.SchemeGroupVersion.Version,
			CABundle:             bytes.Clone(bundle),
			GroupPriorityMinimum: APIServiceGroupPriorityMinimum,
			VersionPriority:      APIServiceVersionPriority,
		},
	}
}

// registration makes sure the APIService exists with the right spec and then
// keeps its caBundle equal to the source's bundle through a cabundle
// Publisher, which also writes back a caBundle someone else changed.
type registration struct {
	client          aggregatorclient.Interface
	namespace, name string
	port            int32
	source          dynamiccertificates.CAContentProvider
	// sourceRunner, when set, is run for the registration's lifetime: a
	// file CA bundle that nothing else runs. The in-memory serving
	// certificate is run by the server.
	sourceRunner dynamiccertificates.ControllerRunner
	publisher    *cabundle.Publisher
	// clock times the retries; nil is the real clock. Tests set a fake one.
	clock clock.Clock
}

// newRegistration builds the clients and the publisher for the APIService
// pointing at Service namespace/name:port, publishing source's bundle.
// sourceRunner, when not nil, is run by the registration (a source nothing
// else runs).
func newRegistration(kubeConfig *rest.Config, namespace, name string, port int32, source dynamiccertificates.CAContentProvider, sourceRunner dynamiccertificates.ControllerRunner) (*registration, error) {
	client, err := aggregatorclient.NewForConfig(rest.AddUserAgent(rest.CopyConfig(kubeConfig), "evercert-example-apiserver"))
	if err != nil {
		return nil, fmt.Errorf("building the apiregistration client: %w", err)
	}
	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{
		Source:           source,
		Targets:          []cabundle.Target{{Kind: cabundle.APIService, Name: APIServiceName}},
		AggregatorClient: client,
	})
	if err != nil {
		return nil, fmt.Errorf("building the caBundle publisher for APIService %s: %w", APIServiceName, err)
	}
	return &registration{
		client: client, namespace: namespace, name: name, port: port,
		source: source, sourceRunner: sourceRunner, publisher: publisher,
	}, nil
}

// run ensures the APIService, retrying with backoff, and then runs the
// publisher, until ctx is done. It returns only once everything it started
// has stopped.
func (r *registration) run(ctx context.Context) {
	logger := klog.FromContext(ctx).WithName("apiservice-registration").WithValues("apiService", APIServiceName)
	ctx = klog.NewContext(ctx, logger)
	var wg sync.WaitGroup
	defer wg.Wait()
	if r.sourceRunner != nil {
		if err := r.sourceRunner.RunOnce(ctx); err != nil {
			logger.Error(err, "Reading the CA bundle to publish failed; retrying in the background")
		}
		wg.Go(func() { r.sourceRunner.Run(ctx, 1) })
	}

	if !r.ensureUntilDone(ctx) {
		return
	}
	logger.Info("APIService registered", "service", r.namespace+"/"+r.name, "port", r.port)
	r.publisher.Run(ctx, 0)
}

// ensureUntilDone calls ensure with backoff until it succeeds (true) or ctx
// ends (false). Each distinct error is logged once.
func (r *registration) ensureUntilDone(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	clk := r.clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	var failing errlog.Once
	return backoff.Retry(ctx, clk, registrationBaseDelay, registrationMaxDelay, r.ensure, func(err error, delay time.Duration) {
		failing.Error(logger, err, "Registering the APIService failed; retrying", "retryIn", delay)
	})
}

// ensure creates the APIService with the current bundle, or updates an
// existing one whose spec differs (a wrong service, group, version or
// priority, insecureSkipTLSVerify set, or no caBundle). A caBundle that is
// merely stale is left to the publisher. A concurrent writer (a conflict,
// or AlreadyExists on create) means re-read and decide again, promptly and
// a few times (retry.DefaultRetry, as RetryOnConflict); it is an error only
// if it persists.
func (r *registration) ensure(ctx context.Context) error {
	concurrentWrite := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }
	return retry.OnError(retry.DefaultRetry, concurrentWrite, func() error { return r.ensureOnce(ctx) })
}

func (r *registration) ensureOnce(ctx context.Context) error {
	bundle := r.source.CurrentCABundleContent()
	if len(bundle) == 0 {
		return fmt.Errorf("the CA provider %q has no bundle yet", r.source.Name())
	}
	want := DesiredAPIService(r.namespace, r.name, r.port, bundle)
	apiServices := r.client.ApiregistrationV1().APIServices()
	existing, err := apiServices.Get(ctx, APIServiceName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		if _, err := apiServices.Create(ctx, want, metav1.CreateOptions{FieldManager: cabundle.DefaultFieldManager}); err != nil {
			return fmt.Errorf("creating APIService %s: %w", APIServiceName, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("reading APIService %s: %w", APIServiceName, err)
	}
	updated := existing.DeepCopy()
	spec := &updated.Spec
	spec.Service, spec.Group, spec.Version = want.Spec.Service, want.Spec.Group, want.Spec.Version
	spec.GroupPriorityMinimum, spec.VersionPriority = want.Spec.GroupPriorityMinimum, want.Spec.VersionPriority
	if spec.InsecureSkipTLSVerify || len(spec.CABundle) == 0 {
		spec.InsecureSkipTLSVerify = false
		spec.CABundle = want.Spec.CABundle
	}
	if apiequality.Semantic.DeepEqual(existing.Spec, updated.Spec) {
		return nil
	}
	if _, err := apiServices.Update(ctx, updated, metav1.UpdateOptions{FieldManager: cabundle.DefaultFieldManager}); err != nil {
		if apierrors.IsConflict(err) {
			return fmt.Errorf("APIService %s changed while being updated: %w", APIServiceName, err)
		}
		return fmt.Errorf("updating APIService %s: %w", APIServiceName, err)
	}
	return nil
}
