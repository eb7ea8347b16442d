package app

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"strings"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/endpoints/discovery"
	"k8s.io/apiserver/pkg/endpoints/handlers/negotiation"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"

	certv1alpha1 "github.com/evercert/evercert/example/apiserver/apis/certificates/v1alpha1"
	"github.com/evercert/evercert/internal/pki"
)

// Paths of the certificates.evercert.io API group.
const (
	// CertificatesGroupPath is the group discovery document.
	CertificatesGroupPath = "/apis/" + certv1alpha1.GroupName
	// CertificatesVersionPath is the version discovery document (an
	// APIResourceList).
	CertificatesVersionPath = CertificatesGroupPath + "/v1alpha1"
	// ServingCertificatesPath lists the served certificates; append
	// "/<provider name>" to get one.
	ServingCertificatesPath = CertificatesVersionPath + "/" + certv1alpha1.Resource
)

// certificatesAPI serves the read-only group certificates.evercert.io/v1alpha1
// from plain handlers. Requests reach it through the server's normal filter
// chain, so the request-info resolver sees a resource request (verb list or
// get on servingcertificates.certificates.evercert.io) and the authorizer,
// standalone or delegated, decides on exactly those attributes.
type certificatesAPI struct {
	serving  *genericapiserver.SecureServingInfo
	loopback dynamiccertificates.SNICertKeyContentProvider
	// serializer negotiates JSON or YAML: the types have no protobuf form.
	serializer runtime.NegotiatedSerializer
	group      http.Handler
	version    http.Handler
}

// jsonYAMLOnly restricts a NegotiatedSerializer to JSON and YAML, so a client
// asking for protobuf only gets 406 Not Acceptable, and one that also
// accepts JSON gets JSON, instead of an encoding error.
type jsonYAMLOnly struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func newJSONYAMLOnly(s runtime.NegotiatedSerializer) jsonYAMLOnly {
	out := jsonYAMLOnly{NegotiatedSerializer: s}
	for _, info := range s.SupportedMediaTypes() {
		if info.MediaType == runtime.ContentTypeJSON || info.MediaType == runtime.ContentTypeYAML {
			out.infos = append(out.infos, info)
		}
	}
	return out
}

// SupportedMediaTypes implements runtime.NegotiatedSerializer.
func (s jsonYAMLOnly) SupportedMediaTypes() []runtime.SerializerInfo { return s.infos }

// apiResource is the resource as the legacy discovery document lists it.
func apiResource() metav1.APIResource {
	return metav1.APIResource{
		Name:         certv1alpha1.Resource,
		SingularName: certv1alpha1.SingularResource,
		Namespaced:   false,
		Kind:         certv1alpha1.Kind,
		Verbs:        slices.Clone(certv1alpha1.Verbs),
	}
}

// installCertificatesAPI adds the group to gs: to the /apis discovery
// document (legacy and aggregated form, so that an aggregating
// kube-apiserver lists it), and handlers for /apis/<group>, the version
// document and the resource on the NonGoRestfulMux. Nothing else may claim
// /apis/certificates.evercert.io: the director hands a path to go-restful
// only when a web service owns its prefix.
func installCertificatesAPI(gs *genericapiserver.GenericAPIServer, loopbackCert dynamiccertificates.SNICertKeyContentProvider) *certificatesAPI {
	gv := certv1alpha1.SchemeGroupVersion
	forDiscovery := metav1.GroupVersionForDiscovery{GroupVersion: gv.String(), Version: gv.Version}
	group := metav1.APIGroup{
		Name:             gv.Group,
		Versions:         []metav1.GroupVersionForDiscovery{forDiscovery},
		PreferredVersion: forDiscovery,
	}
	gs.DiscoveryGroupManager.AddGroup(group)
	gs.AggregatedDiscoveryGroupManager.AddGroupVersion(gv.Group, apidiscoveryv2.APIVersionDiscovery{
		Version:   gv.Version,
		Freshness: apidiscoveryv2.DiscoveryFreshnessCurrent,
		Resources: []apidiscoveryv2.APIResourceDiscovery{{
			Resource:         certv1alpha1.Resource,
			SingularResource: certv1alpha1.SingularResource,
			ResponseKind:     &metav1.GroupVersionKind{Group: gv.Group, Version: gv.Version, Kind: certv1alpha1.Kind},
			Scope:            apidiscoveryv2.ScopeCluster,
			Verbs:            slices.Clone(certv1alpha1.Verbs),
		}},
	})

	api := &certificatesAPI{
		serving:    gs.SecureServingInfo,
		loopback:   loopbackCert,
		serializer: newJSONYAMLOnly(gs.Serializer),
		group:      discovery.NewAPIGroupHandler(gs.Serializer, group),
		version: discovery.NewAPIVersionHandler(gs.Serializer, gv, discovery.APIResourceListerFunc(func() []metav1.APIResource {
			return []metav1.APIResource{apiResource()}
		})),
	}
	gs.Handler.NonGoRestfulMux.Handle(CertificatesGroupPath, api)
	gs.Handler.NonGoRestfulMux.HandlePrefix(CertificatesGroupPath+"/", api)
	return api
}

// ServeHTTP dispatches every path under /apis/certificates.evercert.io.
func (a *certificatesAPI) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	gv := certv1alpha1.SchemeGroupVersion
	rest := strings.Trim(strings.TrimPrefix(req.URL.Path, CertificatesGroupPath), "/")
	parts := strings.Split(rest, "/")
	if rest == "" {
		parts = nil
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		resource := certv1alpha1.Resource
		if len(parts) < 2 {
			resource = req.URL.Path
		}
		a.error(w, req, apierrors.NewMethodNotSupported(gv.WithResource(resource).GroupResource(), strings.ToLower(req.Method)))
		return
	}
	switch {
	case len(parts) == 0:
		a.group.ServeHTTP(w, req)
	case parts[0] != gv.Version:
		a.error(w, req, apierrors.NewNotFound(gv.WithResource("").GroupResource(), parts[0]))
	case len(parts) == 1:
		a.version.ServeHTTP(w, req)
	case parts[1] != certv1alpha1.Resource || len(parts) > 3:
		a.error(w, req, apierrors.NewNotFound(gv.WithResource(parts[1]).GroupResource(), strings.Join(parts[2:], "/")))
	case isWatch(req):
		a.error(w, req, apierrors.NewMethodNotSupported(certv1alpha1.GroupResource(), "watch"))
	case len(parts) == 2:
		a.write(w, req, a.List())
	default:
		for _, item := range a.List().Items {
			if item.Name == parts[2] {
				a.write(w, req, &item)
				return
			}
		}
		a.error(w, req, apierrors.NewNotFound(certv1alpha1.GroupResource(), parts[2]))
	}
}

func isWatch(req *http.Request) bool {
	v := req.URL.Query().Get("watch")
	return v == "true" || v == "1"
}

func (a *certificatesAPI) write(w http.ResponseWriter, req *http.Request, obj runtime.Object) {
	responsewriters.WriteObjectNegotiated(a.serializer, negotiation.DefaultEndpointRestrictions,
		certv1alpha1.SchemeGroupVersion, w, req, http.StatusOK, obj, false)
}

func (a *certificatesAPI) error(w http.ResponseWriter, req *http.Request, err error) {
	responsewriters.ErrorNegotiated(err, a.serializer, certv1alpha1.SchemeGroupVersion, w, req)
}

// List describes what the server serves now: the default serving
// certificate (SecureServingInfo.Cert) first, then every SNI certificate in
// order. Each provider's current content is parsed at every call, so the
// list follows rotations at once.
func (a *certificatesAPI) List() *certv1alpha1.ServingCertificateList {
	list := &certv1alpha1.ServingCertificateList{Items: []certv1alpha1.ServingCertificate{}}
	if a.serving == nil {
		return list
	}
	if a.serving.Cert != nil {
		list.Items = append(list.Items, describe(a.serving.Cert, certv1alpha1.RoleServing, nil))
	}
	for _, p := range a.serving.SNICerts {
		role := certv1alpha1.RoleSNI
		if a.loopback != nil && p == a.loopback {
			role = certv1alpha1.RoleLoopback
		}
		list.Items = append(list.Items, describe(p, role, p.SNINames()))
	}
	return list
}

// describe parses the leaf of p's current certificate chain.
func describe(p dynamiccertificates.CertKeyContentProvider, role string, sniNames []string) certv1alpha1.ServingCertificate {
	item := certv1alpha1.ServingCertificate{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name()},
		Status: certv1alpha1.ServingCertificateStatus{
			Provider: p.Name(),
			Role:     role,
			SNINames: slices.Clone(sniNames),
		},
	}
	certPEM, _ := p.CurrentCertKeyContent()
	chain, err := pki.ParseCABundle(certPEM)
	if err == nil && len(chain) == 0 {
		err = fmt.Errorf("no certificate")
	}
	if err != nil {
		item.Status.Error = fmt.Sprintf("parsing the certificate of provider %q: %v", p.Name(), err)
		return item
	}
	leaf := chain[0]
	st := &item.Status
	st.Subject = leaf.Subject.String()
	st.Issuer = leaf.Issuer.String()
	st.Names = slices.Clone(leaf.DNSNames)
	for _, ip := range leaf.IPAddresses {
		st.Names = append(st.Names, ip.String())
	}
	st.Serial = leaf.SerialNumber.Text(16)
	st.AuthorityKeyID = hex.EncodeToString(leaf.AuthorityKeyId)
	st.NotBefore = metav1.NewTime(leaf.NotBefore)
	st.NotAfter = metav1.NewTime(leaf.NotAfter)
	return item
}
