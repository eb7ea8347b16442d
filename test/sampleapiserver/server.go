package sampleapiserver

import (
	"context"
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/endpoints/openapi"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	"k8s.io/apiserver/pkg/util/compatibility"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"

	"github.com/evercert/evercert/cabundle"
	"github.com/evercert/evercert/loopback"
)

// DefaultEtcdPathPrefix is the etcd key prefix of the server's objects
// (--etcd-prefix), apart from the kube-apiserver's /registry.
const DefaultEtcdPathPrefix = "/evercert-sample"

// InformersHookName is the post-start hook that starts the admission
// plugin's informers.
const InformersHookName = "start-sample-server-informers"

var (
	// Scheme holds the sample types and the unversioned meta types every
	// server encodes.
	Scheme = newScheme()
	// Codecs are Scheme's codecs.
	Codecs = serializer.NewCodecFactory(Scheme)
)

func newScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(addKnownTypes(scheme))
	unversioned := schema.GroupVersion{Version: "v1"}
	metav1.AddToGroupVersion(scheme, unversioned)
	scheme.AddUnversionedTypes(unversioned, &metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
	return scheme
}

// Options are the server's settings, as sample-apiserver's
// WardleServerOptions.
type Options struct {
	// RecommendedOptions are upstream's: etcd, secure serving, delegated
	// authentication and authorization, CoreAPI, admission, features and
	// so on. NewOptions registers the RequireReference admission plugin and
	// appends it to the recommended plugin order. Its
	// ExtraAdmissionInitializers is replaced by Config.
	RecommendedOptions *genericoptions.RecommendedOptions
	// Serving picks the serving certificate and configures the loopback
	// certificate (loopback.ApplyConfig). The zero value serves a
	// self-signed certificate made and rotated in memory.
	Serving loopback.ApplyConfig
	// APIService, when set, names the APIService (e.g.
	// "v1alpha1.sample.evercert.io") whose caBundle the server keeps equal
	// to its serving CA bundle (a cabundle.Publisher, see
	// loopback.Applied.Serving): the in-memory serving CA is written
	// nowhere else. It needs RecommendedOptions.CoreAPI for a client, and a
	// serving certificate with a CA bundle; otherwise Config fails rather
	// than ignore it. Default "": nothing is published.
	APIService string
}

// NewOptions returns the defaults: objects stored under
// DefaultEtcdPathPrefix, encoded as sample.evercert.io/v1alpha1.
func NewOptions() *Options {
	ro := genericoptions.NewRecommendedOptions(DefaultEtcdPathPrefix, Codecs.LegacyCodec(SchemeGroupVersion))
	ro.Etcd.StorageConfig.EncodeVersioner = runtime.NewMultiGroupVersioner(SchemeGroupVersion, schema.GroupKind{Group: GroupName})
	registerPlugin(ro.Admission.Plugins)
	ro.Admission.RecommendedPluginOrder = append(ro.Admission.RecommendedPluginOrder, PluginName)
	return &Options{RecommendedOptions: ro}
}

// Config is a server configuration made by Options.Config.
type Config struct {
	// GenericConfig is the genericapiserver configuration.
	GenericConfig *genericapiserver.RecommendedConfig
	// Applied holds the loopback and serving certificates that
	// loopback.ApplyRecommendedOptions installed.
	Applied *loopback.Applied
	// Publisher keeps Options.APIService's caBundle equal to the serving
	// CA bundle; nil without Options.APIService.
	Publisher *cabundle.Publisher

	// informers is the factory of the admission plugin's informer, built
	// on the loopback client config; started by InformersHookName.
	informers dynamicinformer.DynamicSharedInformerFactory
}

// Config validates o and applies it to a new RecommendedConfig. It is
// sample-apiserver's Config with one change: loopback.ApplyRecommendedOptions
// instead of RecommendedOptions.ApplyTo (and no
// MaybeDefaultWithSelfSignedCerts, whose place Serving takes).
func (o *Options) Config() (*Config, error) {
	if errs := o.RecommendedOptions.Validate(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	c := &Config{GenericConfig: genericapiserver.NewRecommendedConfig(Codecs)}
	ro := *o.RecommendedOptions
	ro.ExtraAdmissionInitializers = func(cfg *genericapiserver.RecommendedConfig) ([]admission.PluginInitializer, error) {
		// As sample-apiserver: the admission plugin's informer reads this
		// server through the loopback client config, which by now is
		// evercert's.
		client, err := dynamic.NewForConfig(cfg.LoopbackClientConfig)
		if err != nil {
			return nil, fmt.Errorf("loopback client for the admission informers: %w", err)
		}
		c.informers = dynamicinformer.NewDynamicSharedInformerFactory(client, 0)
		return []admission.PluginInitializer{flunderInitializer{informer: c.informers.ForResource(FlunderGroupVersionResource)}}, nil
	}
	gc := c.GenericConfig
	gc.EffectiveVersion = compatibility.DefaultBuildEffectiveVersion()
	gc.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(GetOpenAPIDefinitions, openapi.NewDefinitionNamer(Scheme))
	gc.OpenAPIV3Config.Info.Title = "evercert sample"

	applied, err := loopback.ApplyRecommendedOptions(&ro, gc, o.Serving)
	if err != nil {
		return nil, err
	}
	c.Applied = applied
	if o.APIService != "" {
		client, err := newAPIServiceClient(gc)
		if err != nil {
			return nil, err
		}
		if err := c.publishServingCA(o.APIService, client); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// Server is a sample API server, built but not yet serving.
type Server struct {
	// GenericAPIServer is the underlying server.
	GenericAPIServer *genericapiserver.GenericAPIServer

	informers dynamicinformer.DynamicSharedInformerFactory
}

// New builds the server: the generic server, the sample.evercert.io API
// group backed by etcd, and the post-start hook InformersHookName, which
// starts the admission plugin's informers until the server stops.
func (c *Config) New() (*Server, error) {
	gs, err := c.GenericConfig.Complete().New("evercert-sample-apiserver", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return nil, fmt.Errorf("building the generic API server: %w", err)
	}
	storage, err := newFlunderStorage(Scheme, c.GenericConfig.RESTOptionsGetter)
	if err != nil {
		return nil, err
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(GroupName, Scheme, metav1.ParameterCodec, Codecs)
	group.VersionedResourcesStorageMap[SchemeGroupVersion.Version] = map[string]rest.Storage{Resource: storage}
	if err := gs.InstallAPIGroup(&group); err != nil {
		return nil, fmt.Errorf("installing %s: %w", GroupName, err)
	}
	s := &Server{GenericAPIServer: gs, informers: c.informers}
	if s.informers != nil {
		if err := gs.AddPostStartHook(InformersHookName, func(ctx genericapiserver.PostStartHookContext) error {
			s.informers.Start(ctx.Done())
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Run serves until ctx is done, then shuts down and returns once the
// informers' goroutines have ended too.
func (s *Server) Run(ctx context.Context) error {
	err := s.GenericAPIServer.PrepareRun().RunWithContext(ctx)
	if s.informers != nil {
		s.informers.Shutdown()
	}
	return err
}
