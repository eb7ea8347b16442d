package sampleapiserver

import (
	"errors"
	"fmt"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/client-go/rest"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/cabundle"
)

// PublishHookName is the post-start hook that runs the caBundle publisher
// of Options.APIService.
const PublishHookName = "publish-serving-ca-bundle"

// newAPIServiceClient builds the apiregistration client of
// Options.APIService from the CoreAPI client config (--kubeconfig, or the
// in-cluster config).
func newAPIServiceClient(cfg *genericapiserver.RecommendedConfig) (aggregatorclient.Interface, error) {
	if cfg.ClientConfig == nil {
		return nil, errors.New("APIService: publishing the serving CA bundle needs a kube-apiserver: set RecommendedOptions.CoreAPI (--kubeconfig, or run in a cluster)")
	}
	client, err := aggregatorclient.NewForConfig(rest.AddUserAgent(rest.CopyConfig(cfg.ClientConfig), "evercert-sample-apiserver"))
	if err != nil {
		return nil, fmt.Errorf("APIService: building the apiregistration client: %w", err)
	}
	return client, nil
}

// publishServingCA keeps the caBundle of APIService apiService equal to
// the CA bundle of the applied serving certificate, which for the
// self-signed default exists only in memory: a cabundle.Publisher, made an
// observer of the serving CA's rotation (a successor CA signs only once
// the APIService holds it) when the serving certificate rotates its CA, a
// readiness check, and the post-start hook PublishHookName that runs the
// publisher until the server stops. The APIService itself (its service,
// group and version) is the deployer's; the publisher waits for it.
func (c *Config) publishServingCA(apiService string, client aggregatorclient.Interface) error {
	if c.Applied == nil || c.Applied.Serving == nil {
		return fmt.Errorf("APIService %s: secure serving is off, there is no serving CA to publish", apiService)
	}
	source, ok := c.Applied.Serving.(dynamiccertificates.CAContentProvider)
	if !ok {
		return fmt.Errorf("APIService %s: the serving certificate %q has no CA bundle to publish (certificate files or a provider without a CA): publish your CA yourself", apiService, c.Applied.Serving.Name())
	}
	publisher, err := cabundle.NewPublisher(cabundle.PublisherConfig{
		Source:           source,
		Targets:          []cabundle.Target{{Kind: cabundle.APIService, Name: apiService}},
		AggregatorClient: client,
		Name:             "apiservice-ca-bundle",
	})
	if err != nil {
		return fmt.Errorf("APIService %s: %w", apiService, err)
	}
	if issuer, ok := source.(interface{ AddObserver(authority.Observer) }); ok {
		issuer.AddObserver(publisher)
	}
	c.GenericConfig.AddReadyzChecks(publisher.HealthCheck())
	c.Publisher = publisher
	return c.GenericConfig.AddPostStartHook(PublishHookName, func(ctx genericapiserver.PostStartHookContext) error {
		go publisher.Run(ctx, 0) // ends with the hook context, when the server stops
		return nil
	})
}
