package cabundle

import (
	"fmt"

	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"
)

// userAgent is the user agent of the clients built from
// PublisherConfig.KubeConfig.
const userAgent = "evercert-cabundle"

// clients hands the kinds the API clients of a PublisherConfig: the one the
// config holds or, on first use, one built from its KubeConfig. A client
// is built only for a kind some target needs, so a config without
// KubeConfig needs only the clients of its targets' kinds.
type clients struct {
	cfg *PublisherConfig
}

// kube returns the client of the core API groups (admissionregistration).
func (c *clients) kube() (kubernetes.Interface, error) {
	return clientFor(&c.cfg.KubeClient, "KubeClient", c.cfg, func(rc *rest.Config) (kubernetes.Interface, error) {
		return kubernetes.NewForConfig(rc)
	})
}

// apiExtensions returns the client of apiextensions.k8s.io.
func (c *clients) apiExtensions() (apiextensionsclient.Interface, error) {
	return clientFor(&c.cfg.APIExtensionsClient, "APIExtensionsClient", c.cfg, func(rc *rest.Config) (apiextensionsclient.Interface, error) {
		return apiextensionsclient.NewForConfig(rc)
	})
}

// aggregator returns the client of apiregistration.k8s.io.
func (c *clients) aggregator() (aggregatorclient.Interface, error) {
	return clientFor(&c.cfg.AggregatorClient, "AggregatorClient", c.cfg, func(rc *rest.Config) (aggregatorclient.Interface, error) {
		return aggregatorclient.NewForConfig(rc)
	})
}

// clientFor returns *field when it is set, and otherwise builds it from
// cfg.KubeConfig (copied, with evercert's user agent) and stores it there,
// so that kinds sharing a client share one. name is the field's name in
// PublisherConfig, for the error.
func clientFor[C any](field *C, name string, cfg *PublisherConfig, build func(*rest.Config) (C, error)) (C, error) {
	if any(*field) != nil {
		return *field, nil
	}
	var zero C
	if cfg.KubeConfig == nil {
		return zero, fmt.Errorf("neither PublisherConfig.%s nor PublisherConfig.KubeConfig is set", name)
	}
	c, err := build(rest.AddUserAgent(rest.CopyConfig(cfg.KubeConfig), userAgent))
	if err != nil {
		return zero, fmt.Errorf("building PublisherConfig.%s from PublisherConfig.KubeConfig: %w", name, err)
	}
	*field = c
	return c, nil
}
