package app

import (
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
