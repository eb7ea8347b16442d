package app

import (
	"fmt"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/authentication/request/anonymous"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizerfactory"
	"k8s.io/apiserver/pkg/authorization/path"
	"k8s.io/apiserver/pkg/authorization/union"
	genericapiserver "k8s.io/apiserver/pkg/server"
)

// PublicPaths may be read anonymously, as kube-apiserver's
// system:public-info-viewer role allows: probes need no credentials.
var PublicPaths = []string{"/healthz", "/livez", "/readyz", "/version"}

// applyAuth sets up authentication and authorization for a standalone
// server. Authentication: anonymous for PublicPaths only; the loopback
// token is added in front by Config.Complete (genericapiserver's
// AuthorizeClientBearerToken maps it to user system:apiserver in group
// system:masters). Authorization: PublicPaths for everyone, everything for
// system:masters, nothing else.
func applyAuth(cfg *genericapiserver.Config) error {
	conditions := make([]apiserver.AnonymousAuthCondition, 0, len(PublicPaths))
	for _, p := range PublicPaths {
		conditions = append(conditions, apiserver.AnonymousAuthCondition{Path: p})
	}
	cfg.Authentication.Authenticator = anonymous.NewAuthenticator(conditions)

	public, err := path.NewAuthorizer(PublicPaths)
	if err != nil {
		return err
	}
	authz, err := union.New(
		union.NamedAuthorizer{AuthorizerName: "public-paths", Authorizer: public},
		union.NamedAuthorizer{AuthorizerName: "privileged-groups", Authorizer: authorizerfactory.NewPrivilegedGroups(user.SystemPrivilegedGroup)},
	)
	if err != nil {
		return err
	}
	cfg.Authorization.Authorizer = authz
	return nil
}

// applyDelegatedAuth sets up authentication and authorization delegated to
// the kube-apiserver of o.Kubeconfig, as an aggregated API server does
// upstream (DelegatingAuthenticationOptions, DelegatingAuthorizationOptions):
//
//   - authentication: bearer tokens by TokenReview; client certificates
//     against the client CA; requests proxied by the aggregator by the
//     request-header CA, allowed names and headers. Both CAs come from the
//     kube-system/extension-apiserver-authentication ConfigMap (read at once
//     and then watched) unless --client-ca-file or
//     --requestheader-client-ca-file give them. Anonymous requests are
//     allowed through to authorization.
//   - authorization: system:masters and the always-allowed paths (/healthz,
//     /readyz, /livez by default) without a request; everything else by
//     SubjectAccessReview.
//
// The loopback token still authenticates as system:apiserver in
// system:masters: Config.Complete puts its authenticator in front of this
// one (AuthorizeClientBearerToken), and the privileged-group authorizer
// admits it. The options in o are not modified.
func applyDelegatedAuth(cfg *genericapiserver.Config, o *Options) error {
	authn := *o.Authentication
	if authn.RemoteKubeConfigFile == "" {
		authn.RemoteKubeConfigFile = o.Kubeconfig
	}
	if err := authn.ApplyTo(&cfg.Authentication, cfg.SecureServing, cfg.OpenAPIConfig); err != nil {
		return fmt.Errorf("delegated authentication: %w", err)
	}
	authz := *o.Authorization
	if authz.RemoteKubeConfigFile == "" {
		authz.RemoteKubeConfigFile = o.Kubeconfig
	}
	if err := authz.ApplyTo(&cfg.Authorization); err != nil {
		return fmt.Errorf("delegated authorization: %w", err)
	}
	return nil
}
