package server

import (
	"crypto/fips140"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/evercert/evercert/authority"
	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

// DefaultCipherSuites are the TLS 1.2 suites offered by default: ECDHE key
// exchange with an AEAD cipher only. TLS 1.3 suites are not configurable in
// Go and are always offered. In FIPS 140-3 mode (GODEBUG=fips140=on or
// only) the ChaCha20-Poly1305 suites, which are not approved, are left out,
// so the default works there and an explicit ChaCha20 suite is refused.
var DefaultCipherSuites = fipsFilter([]string{
	"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
	"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
	"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
	"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
})

// Options are the secure-serving settings of an evercert server. Flag names
// and syntax follow kube-apiserver's. The zero value is not usable; start
// from NewOptions.
type Options struct {
	// BindAddress is the IP to listen on. Flag --bind-address, default 127.0.0.1.
	BindAddress net.IP
	// SecurePort is the port to listen on; 0 picks a free one. Flag
	// --secure-port, default 8443.
	SecurePort int

	// CertFile and KeyFile are the default serving certificate (with its
	// intermediates) and key, reloaded when they change. They may name the
	// same file, holding key and chain (see dynamiccert.FileCertKeyConfig).
	// Flags --tls-cert-file, --tls-private-key-file.
	CertFile, KeyFile string
	// SNICertKeys are extra certificates selected by SNI. Flag
	// --tls-sni-cert-key cert,key[:name1,name2], repeatable.
	SNICertKeys []cliflag.NamedCertKey
	// ClientCAFile, when set, makes the server verify client certificates
	// signed by these CAs. It must load at start-up (Serving.RunOnce fails
	// otherwise); a later bad write keeps the last good bundle. Flag
	// --client-ca-file.
	ClientCAFile string
	// MinTLSVersion is a crypto/tls version name. Flag --tls-min-version,
	// default VersionTLS12.
	MinTLSVersion string
	// CipherSuites for TLS 1.2, by name. Flag --tls-cipher-suites, default
	// DefaultCipherSuites. Validate refuses Go's insecure suites and, below
	// TLS 1.3, a list without one of the suites HTTP/2 requires
	// (TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256): HTTP/2 is always served.
	CipherSuites []string

	// SelfSignedHosts are the names of the embedded self-signed default,
	// used when no certificate flag is given, and of --ca-secret's leaf:
	// DNS names, wildcards and IP addresses (dynamiccert.ValidateHost).
	// Flag --self-signed-hosts, default localhost,127.0.0.1,::1.
	SelfSignedHosts []string
	// SelfSignedKeyTypes are the key types of the self-signed default's
	// leaves, and of --ca-secret's: one leaf per type for the same names,
	// signed by the same CA and renewed together; each client gets the
	// first it supports, ECDSA first (see dynamiccert.KeyType). Flag
	// --self-signed-key-types, default ecdsa-p256.
	SelfSignedKeyTypes []string
	// SelfSignedValidity is the lifetime of the self-signed leaf. Flag
	// --self-signed-validity, default 720h, at least 1s
	// (authority.MinLifetime), at most dynamiccert.MaxLifetime, and at
	// most its third (an eighth with --ca-secret) without CAValidity.
	SelfSignedValidity time.Duration
	// SelfSignedRenewBefore is how long before expiry the leaf is renewed.
	// Flag --self-signed-renew-before, default a third of the validity.
	SelfSignedRenewBefore time.Duration
	// CAValidity is the lifetime of each CA of the self-signed default and
	// --ca-secret. Flag --ca-validity, default 0: three leaf lifetimes for
	// the self-signed default, eight for --ca-secret. At most
	// dynamiccert.MaxLifetime.
	CAValidity time.Duration
	// CARenewBefore is how long before the signing CA expires its successor
	// is published. Flag --ca-renew-before, default 0: a third of
	// --ca-validity.
	CARenewBefore time.Duration
	// CAPropagationDelay is the minimum time a published successor CA waits
	// before it signs, for consumers evercert cannot observe; it also waits
	// for every observer (see authority's observed rotation). Flag
	// --ca-propagation-delay, default 0: a quarter of the CA renew-before
	// minus the leaf renew-before.
	CAPropagationDelay time.Duration
	// ClockSkewTolerance is the clock skew tolerated between replicas and
	// clients: certificates are backdated by it. Flag
	// --clock-skew-tolerance, default 0: one hour, or a quarter of the leaf
	// renew-before when shorter.
	ClockSkewTolerance time.Duration
	// CABundleFile, when set, receives the current trust bundle for clients
	// (0644, written atomically, rewritten at every rotation). Flag
	// --ca-bundle-file.
	CABundleFile string

	// TLSSecret ("namespace/name") serves the default certificate from a
	// Secret's tls.crt and tls.key, followed by a watch. Flag --tls-secret.
	TLSSecret string
	// CASecret ("namespace/name") keeps a CA in a Secret, shared by every
	// replica, and serves a leaf for SelfSignedHosts signed by it (lifetime
	// SelfSignedValidity). Flag --ca-secret.
	CASecret string
	// ReplicaID names this replica in the Lease it announces itself in to
	// the other replicas of --ca-secret (authority.Config.
	// ReplicaID). Give each pod its own, stable across restarts of its
	// process: the pod name. Flag --replica-id, default $POD_NAME
	// (NewOptions reads it; authority.PodNameEnv), else the host name
	// with a random suffix.
	ReplicaID string
	// Kubeconfig is the kubeconfig file for --tls-secret and --ca-secret;
	// empty means the in-cluster config. Flag --kubeconfig.
	Kubeconfig string
	// KubeconfigUsedElsewhere says that the program embedding these options
	// uses Kubeconfig for clients of its own, so Validate does not reject a
	// Kubeconfig given without --tls-secret or --ca-secret. Default false.
	KubeconfigUsedElsewhere bool

	// ResyncInterval is how often file sources are re-read even without a
	// change event. Not a flag; default one minute.
	ResyncInterval time.Duration
	// Clock drives rotation and validity checks. Not a flag; default the
	// real clock. Tests inject a fake one.
	Clock clock.WithTicker
	// ShutdownTimeout bounds how long in-flight requests may take to finish
	// once the server is asked to stop; connections still open then are
	// closed, with a warning naming them, and Serve returns nil. It must be
	// positive. Flag --shutdown-timeout, default 10s.
	ShutdownTimeout time.Duration
	// StartupTimeout bounds how long RunOnce (and so Serve) retries, with
	// backoff, reading --tls-secret or --ca-secret while the API server
	// does not answer or the Secret cannot be loaded; then it fails naming
	// the last error. It must be positive. Flag --startup-timeout, default
	// DefaultStartupTimeout.
	StartupTimeout time.Duration
}

// DefaultStartupTimeout is the default of --startup-timeout: long enough
// for an API server that restarts (a control-plane upgrade) to answer
// again, short enough that a process that cannot start says why while its
// operator is looking.
const DefaultStartupTimeout = 2 * time.Minute

// defaultSelfSignedKeyTypes is the default of --self-signed-key-types.
var defaultSelfSignedKeyTypes = []string{string(dynamiccert.ECDSAP256)}

// NewOptions returns Options with every default filled in.
func NewOptions() *Options {
	return &Options{
		BindAddress:        net.ParseIP("127.0.0.1"),
		SecurePort:         8443,
		MinTLSVersion:      "VersionTLS12",
		CipherSuites:       append([]string(nil), DefaultCipherSuites...),
		SelfSignedHosts:    append([]string(nil), authority.DefaultSelfSignedHosts...),
		SelfSignedKeyTypes: slices.Clone(defaultSelfSignedKeyTypes),
		SelfSignedValidity: authority.DefaultSelfSignedLifetime,
		ResyncInterval:     time.Minute,
		Clock:              clock.RealClock{},
		ShutdownTimeout:    10 * time.Second,
		StartupTimeout:     DefaultStartupTimeout,
		ReplicaID:          os.Getenv(authority.PodNameEnv),
	}
}

// AddFlags registers the options' flags on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.IPVar(&o.BindAddress, "bind-address", o.BindAddress, "The IP address on which to listen for --secure-port.")
	fs.IntVar(&o.SecurePort, "secure-port", o.SecurePort, "The port on which to serve HTTPS. 0 picks a free port; the log line 'serving on https://HOST:PORT' says which.")
	fs.StringVar(&o.CertFile, "tls-cert-file", o.CertFile, "File containing the default x509 certificate for HTTPS, followed by its intermediates in order (each the issuer of the one before). Reloaded when it changes. Without any certificate flag the server serves an in-memory self-signed certificate.")
	fs.StringVar(&o.KeyFile, "tls-private-key-file", o.KeyFile, "File containing the default x509 private key matching --tls-cert-file. It may be the same file as --tls-cert-file, holding the key and the chain in either order (as a podCertificate projected volume's credentialBundlePath does).")
	fs.Var(cliflag.NewNamedCertKeyArray(&o.SNICertKeys), "tls-sni-cert-key", "A pair of x509 certificate (and intermediates) and private key file paths, which may be the same file holding both, optionally suffixed with a list of domain patterns, e.g. \"example.crt,example.key\" or \"foo.crt,foo.key:*.foo.com,foo.com\". Explicit names replace the names in the certificate; the earlier flag wins a name claimed twice by certificates of the same key algorithm. "+
		"Certificates of different key algorithms (ECDSA, RSA) for the same name are both served, and each client gets the one it supports, ECDSA first; a pair with exactly the DNS and IP SANs of --tls-cert-file's certificate is also served to clients that send no name. Repeatable.")
	fs.StringVar(&o.ClientCAFile, "client-ca-file", o.ClientCAFile, "If set, client certificates signed by one of these CAs are verified (presenting one is optional). Reloaded when it changes.")
	fs.StringVar(&o.MinTLSVersion, "tls-min-version", o.MinTLSVersion, "Minimum TLS version supported. Possible values: "+strings.Join(cliflag.TLSPossibleVersions(), ", "))
	fs.StringSliceVar(&o.CipherSuites, "tls-cipher-suites", o.CipherSuites, "Comma-separated list of TLS 1.2 cipher suites (TLS 1.3 suites are always enabled and not configurable). "+
		"Below --tls-min-version=VersionTLS13 the list must include TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256 or TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, "+
		"which HTTP/2 requires: a list without either is refused (HTTP/2 is never switched off). Go's insecure suites are refused. Possible values: "+strings.Join(acceptedCipherSuites(), ", "))
	fs.StringSliceVar(&o.SelfSignedHosts, "self-signed-hosts", o.SelfSignedHosts, "DNS names, wildcards (*.example.com) and IP addresses of the in-memory self-signed certificate served when no certificate flag is given (and of --ca-secret's), comma separated; anything else (a port, a URL, a network) is refused.")
	fs.StringSliceVar(&o.SelfSignedKeyTypes, "self-signed-key-types", o.SelfSignedKeyTypes, "Comma-separated key types of the self-signed certificate (and of --ca-secret's): one certificate per type for the same names, renewed together; each client gets the first it supports, ECDSA first. "+
		"With an RSA type the CA is RSA too, so clients that cannot verify ECDSA verify every chain. All are approved in FIPS 140-3 mode. Possible values: "+strings.ReplaceAll(strings.Trim(fmt.Sprint(dynamiccert.KeyTypes), "[]"), " ", ", "))
	fs.DurationVar(&o.SelfSignedValidity, "self-signed-validity", o.SelfSignedValidity, fmt.Sprintf("Lifetime of the self-signed serving certificate, at least 1s. Its CA lives three times as long (eight with --ca-secret) unless --ca-validity is set, so it is at most %v (%v with --ca-secret) without --ca-validity, %v with it.",
		dynamiccert.MaxLifetime/3, dynamiccert.MaxLifetime/8, dynamiccert.MaxLifetime))
	fs.DurationVar(&o.SelfSignedRenewBefore, "self-signed-renew-before", o.SelfSignedRenewBefore, "How long before expiry the self-signed certificate is renewed. 0 means a third of --self-signed-validity.")
	fs.DurationVar(&o.CAValidity, "ca-validity", o.CAValidity, "Lifetime of each CA of the self-signed default and --ca-secret, at most "+dynamiccert.MaxLifetime.String()+". 0 means three --self-signed-validity (eight with --ca-secret).")
	fs.DurationVar(&o.CARenewBefore, "ca-renew-before", o.CARenewBefore, "How long before the signing CA expires its successor joins the published bundles. 0 means a third of --ca-validity.")
	fs.DurationVar(&o.CAPropagationDelay, "ca-propagation-delay", o.CAPropagationDelay, "Minimum time a published successor CA waits before it signs, for clients evercert cannot observe; it also waits until every caBundle target, the --ca-bundle-file and every live replica hold it. 0 means a quarter of (--ca-renew-before minus --self-signed-renew-before).")
	fs.DurationVar(&o.ClockSkewTolerance, "clock-skew-tolerance", o.ClockSkewTolerance, "Clock skew tolerated between replicas and clients; certificates are backdated by it. 0 means one hour, or a quarter of --self-signed-renew-before when shorter.")
	fs.StringVar(&o.CABundleFile, "ca-bundle-file", o.CABundleFile, "If set, the CA bundle clients should trust is written here (0644, atomically) and rewritten at every rotation.")
	fs.StringVar(&o.TLSSecret, "tls-secret", o.TLSSecret, "namespace/name of a Secret whose tls.crt and tls.key are the default certificate, followed by a watch (RBAC: get, list, watch on that Secret).")
	fs.StringVar(&o.CASecret, "ca-secret", o.CASecret, "namespace/name of a Secret that holds a CA shared by every replica (created if missing); each replica serves its own leaf for --self-signed-hosts signed by it.")
	fs.StringVar(&o.ReplicaID, "replica-id", o.ReplicaID, "Name of this replica in the Lease it announces itself in to the other replicas of --ca-secret; each pod needs its own, stable across restarts of its process. Default $POD_NAME (set it from the downward API), else the host name with a random suffix.")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "How long in-flight requests may take to finish after SIGTERM. Connections still open then (a slow request, a client that does not read its response, a stalled handshake) are closed, a warning names them, and the server exits 0. Keep it below the pod's terminationGracePeriodSeconds.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "kubeconfig file for --tls-secret and --ca-secret; empty means the in-cluster config.")
	fs.DurationVar(&o.StartupTimeout, "startup-timeout", o.StartupTimeout, "How long start-up retries, with backoff, reading --tls-secret or --ca-secret while the API server does not answer or the Secret cannot be loaded; then the process exits naming the last error.")
}

// Validate checks every option and returns one error per bad value, each
// naming its flag.
func (o *Options) Validate() []error {
	var errs []error
	if o.BindAddress == nil {
		errs = append(errs, errors.New("--bind-address: must be an IP address"))
	}
	if o.SecurePort < 0 || o.SecurePort > 65535 {
		errs = append(errs, fmt.Errorf("--secure-port: %d must be between 0 and 65535", o.SecurePort))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--shutdown-timeout: %v must be positive", o.ShutdownTimeout))
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		errs = append(errs, errors.New("--tls-cert-file and --tls-private-key-file: both or neither must be set"))
	}
	var defaults []string
	for flag, v := range map[string]string{"--tls-cert-file": o.CertFile, "--tls-secret": o.TLSSecret, "--ca-secret": o.CASecret} {
		if v != "" {
			defaults = append(defaults, flag)
		}
	}
	if len(defaults) > 1 {
		slices.Sort(defaults)
		errs = append(errs, fmt.Errorf("%s: only one source of the default certificate may be given", strings.Join(defaults, ", ")))
	}
	for flag, v := range map[string]string{"--tls-secret": o.TLSSecret, "--ca-secret": o.CASecret} {
		if v == "" {
			continue
		}
		if _, _, err := splitNamespacedName(v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", flag, err))
		}
	}
	if o.StartupTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--startup-timeout: %v must be positive", o.StartupTimeout))
	} else if o.StartupTimeout != DefaultStartupTimeout && o.TLSSecret == "" && o.CASecret == "" {
		errs = append(errs, errors.New("--startup-timeout: only used with --tls-secret or --ca-secret"))
	}
	if o.ReplicaID != "" && o.CASecret == "" && o.ReplicaID != os.Getenv(authority.PodNameEnv) {
		// Its $POD_NAME default is set in every pod, with or without --ca-secret.
		errs = append(errs, errors.New("--replica-id: only used with --ca-secret"))
	}
	if strings.TrimSpace(o.ReplicaID) != o.ReplicaID {
		errs = append(errs, fmt.Errorf("--replica-id: %q must not begin or end with white space", o.ReplicaID))
	}
	if o.Kubeconfig != "" && o.TLSSecret == "" && o.CASecret == "" && !o.KubeconfigUsedElsewhere {
		errs = append(errs, errors.New("--kubeconfig: only used with --tls-secret or --ca-secret"))
	}
	for i, nck := range o.SNICertKeys {
		if nck.CertFile == "" || nck.KeyFile == "" {
			errs = append(errs, fmt.Errorf("--tls-sni-cert-key[%d]: both a certificate and a key file are required", i))
		}
		if err := dynamiccert.ValidateHosts(fmt.Sprintf("--tls-sni-cert-key[%d] names", i), nck.Names); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := cliflag.TLSVersion(o.MinTLSVersion); err != nil {
		errs = append(errs, fmt.Errorf("--tls-min-version: %w", err))
	}
	if suites, err := cliflag.TLSCipherSuites(o.CipherSuites); err != nil {
		errs = append(errs, fmt.Errorf("--tls-cipher-suites: %w", err))
	} else if insecure := insecureSuites(suites); len(insecure) > 0 {
		errs = append(errs, fmt.Errorf("--tls-cipher-suites: insecure suites are not allowed: %s", strings.Join(insecure, ", ")))
	} else if minVersion, err := cliflag.TLSVersion(o.MinTLSVersion); err == nil {
		if err := checkHTTP2CipherSuites(minVersion, suites); err != nil {
			errs = append(errs, fmt.Errorf("--tls-cipher-suites: %w", err))
		}
	}
	if o.usesSelfSigned() || o.CASecret != "" {
		if len(o.SelfSignedHosts) == 0 {
			errs = append(errs, errors.New("--self-signed-hosts: at least one name is required"))
		} else if err := dynamiccert.ValidateHosts("--self-signed-hosts", o.SelfSignedHosts); err != nil {
			errs = append(errs, err)
		}
		// The CA lives caFactor leaf lifetimes unless --ca-validity says
		// otherwise (see its help).
		caFactor, caSource := int64(3), "the self-signed default"
		if o.CASecret != "" {
			caFactor, caSource = 8, "--ca-secret"
		}
		if o.SelfSignedValidity < authority.MinLifetime {
			// X.509 cannot express less, and a leaf is re-issued at most
			// once per authority.MinReissueInterval.
			errs = append(errs, fmt.Errorf("--self-signed-validity: %v must be at least %v", o.SelfSignedValidity, authority.MinLifetime))
		} else if o.SelfSignedValidity > dynamiccert.MaxLifetime {
			errs = append(errs, fmt.Errorf("--self-signed-validity: %v must be at most %v", o.SelfSignedValidity, dynamiccert.MaxLifetime))
		} else if limit := dynamiccert.MaxLifetime / time.Duration(caFactor); o.CAValidity == 0 && o.SelfSignedValidity > limit {
			errs = append(errs, fmt.Errorf("--self-signed-validity: %v must be at most %v without --ca-validity: the CA of %s then lives %d times as long, at most %v; set --ca-validity for a longer leaf",
				o.SelfSignedValidity, limit, caSource, caFactor, dynamiccert.MaxLifetime))
		} else if o.SelfSignedRenewBefore < 0 || o.SelfSignedRenewBefore >= o.SelfSignedValidity {
			errs = append(errs, fmt.Errorf("--self-signed-renew-before: %v must be between 0 and --self-signed-validity (%v)", o.SelfSignedRenewBefore, o.SelfSignedValidity))
		}
		for flag, v := range map[string]time.Duration{"--ca-validity": o.CAValidity, "--ca-renew-before": o.CARenewBefore, "--ca-propagation-delay": o.CAPropagationDelay, "--clock-skew-tolerance": o.ClockSkewTolerance} {
			if v < 0 {
				errs = append(errs, fmt.Errorf("%s: %v must not be negative", flag, v))
			}
		}
		if o.CAValidity > dynamiccert.MaxLifetime {
			errs = append(errs, fmt.Errorf("--ca-validity: %v must be at most %v", o.CAValidity, dynamiccert.MaxLifetime))
		}
		if _, err := dynamiccert.ParseKeyTypes(o.SelfSignedKeyTypes); err != nil {
			errs = append(errs, fmt.Errorf("--self-signed-key-types: %w", err))
		}
	} else {
		if !slices.Equal(o.SelfSignedKeyTypes, defaultSelfSignedKeyTypes) {
			errs = append(errs, errors.New("--self-signed-key-types: only used with the self-signed default or --ca-secret; for files, give one --tls-sni-cert-key pair per key type"))
		}
		for flag, v := range map[string]time.Duration{"--ca-validity": o.CAValidity, "--ca-renew-before": o.CARenewBefore, "--ca-propagation-delay": o.CAPropagationDelay, "--clock-skew-tolerance": o.ClockSkewTolerance} {
			if v != 0 {
				errs = append(errs, fmt.Errorf("%s: only used with the self-signed default or --ca-secret", flag))
			}
		}
	}
	if o.CABundleFile != "" && !o.usesSelfSigned() && o.CASecret == "" {
		errs = append(errs, errors.New("--ca-bundle-file: the serving certificate has no CA evercert knows; use it with the self-signed default or --ca-secret"))
	}
	return append(errs, o.validateFIPS()...)
}

// usesSelfSigned reports whether no certificate source was given, so the
// embedded self-signed default serves.
func (o *Options) usesSelfSigned() bool {
	return o.CertFile == "" && o.TLSSecret == "" && o.CASecret == "" && len(o.SNICertKeys) == 0
}

func splitNamespacedName(v string) (string, string, error) {
	ns, name, ok := strings.Cut(v, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q must be namespace/name", v)
	}
	return ns, name, nil
}

// http2RequiredSuites are the TLS 1.2 suites of which net/http's bundled
// HTTP/2 server (http2ConfigureServer in net/http/h2_bundle.go, Go 1.26)
// requires at least one.
var http2RequiredSuites = []uint16{
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
}

// checkHTTP2CipherSuites applies net/http's HTTP/2 rule to a served
// tls.Config: a non-nil CipherSuites list with MinVersion below TLS 1.3 must
// contain one of http2RequiredSuites, or http.Server.ServeTLS fails with
// "http2: TLSConfig.CipherSuites is missing an HTTP/2-required
// AES_128_GCM_SHA256 cipher". With MinVersion TLS 1.3 crypto/tls ignores
// the list and so does net/http; a nil list means Go's defaults. evercert
// always serves HTTP/2, so such a list is refused rather than HTTP/2 being
// switched off silently.
func checkHTTP2CipherSuites(minVersion uint16, suites []uint16) error {
	if suites == nil || minVersion >= tls.VersionTLS13 {
		return nil
	}
	if slices.ContainsFunc(suites, func(id uint16) bool { return slices.Contains(http2RequiredSuites, id) }) {
		return nil
	}
	return fmt.Errorf("HTTP/2 requires %s or %s when --tls-min-version is below VersionTLS13; the list has neither",
		tls.CipherSuiteName(http2RequiredSuites[1]), tls.CipherSuiteName(http2RequiredSuites[0]))
}

// acceptedCipherSuites returns the names --tls-cipher-suites lists as
// possible values: Go's secure TLS 1.2 suites (tls.CipherSuites), sorted.
// Validate refuses every suite of tls.InsecureCipherSuites (RC4, 3DES, CBC
// with SHA-256, RSA key exchange), so those are not offered. The names of
// TLS 1.3 suites are accepted for compatibility with kube-apiserver but
// ignored, as crypto/tls does not make them configurable. In FIPS 140-3 mode
// only the approved suites are listed.
func acceptedCipherSuites() []string {
	var names []string
	for _, s := range tls.CipherSuites() {
		if slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
			names = append(names, s.Name)
		}
	}
	slices.Sort(names)
	return fipsFilter(names)
}

func insecureSuites(ids []uint16) []string {
	var bad []string
	for _, id := range ids {
		for _, s := range tls.InsecureCipherSuites() {
			if s.ID == id {
				bad = append(bad, s.Name)
			}
		}
	}
	return bad
}

// keyTypes returns --self-signed-key-types parsed; Validate has checked it.
func (o *Options) keyTypes() []dynamiccert.KeyType {
	kts, _ := dynamiccert.ParseKeyTypes(o.SelfSignedKeyTypes)
	return kts
}

func (o *Options) selfSignedConfig() authority.SelfSignedConfig {
	return authority.SelfSignedConfig{
		Name:        "self-signed",
		Hosts:       o.SelfSignedHosts,
		KeyTypes:    o.keyTypes(),
		Lifetime:    o.SelfSignedValidity,
		RenewBefore: o.SelfSignedRenewBefore,
		CALifetime:  o.CAValidity, CARenewBefore: o.CARenewBefore,
		PropagationDelay: o.CAPropagationDelay, SkewTolerance: o.ClockSkewTolerance,
		Clock: o.Clock,
	}
}

// scheduleFlags names the flags whose combination an issuer validates, for
// its errors.
const scheduleFlags = "--self-signed-key-types, --self-signed-validity, --self-signed-renew-before, --ca-validity, --ca-renew-before, --ca-propagation-delay, --clock-skew-tolerance"

// fipsApprovedSuites are the suites evercert accepts in FIPS 140-3 mode:
// those crypto/tls allows there (allowedCipherSuitesFIPS and
// allowedCipherSuitesTLS13FIPS in crypto/tls/defaults_fips140.go, Go 1.26)
// minus the CBC suites tls.InsecureCipherSuites lists. test/fips checks them
// against crypto/tls under GODEBUG=fips140=only.
var fipsApprovedSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_AES_128_GCM_SHA256,
	tls.TLS_AES_256_GCM_SHA384,
}

// fipsFilter drops the suite names that are not approved in FIPS 140-3
// mode; outside it, names are returned as they are.
func fipsFilter(names []string) []string {
	if !fips140.Enabled() {
		return names
	}
	return slices.DeleteFunc(names, func(name string) bool {
		return !slices.ContainsFunc(fipsApprovedSuites, func(id uint16) bool { return tls.CipherSuiteName(id) == name })
	})
}

var logFIPSOnce sync.Once

// validateFIPS refuses, in FIPS 140-3 mode (crypto/fips140.Enabled: the
// GODEBUG fips140=on or only, which is the default of a GOFIPS140 build),
// what Go's FIPS 140-3 module would refuse in handshakes later: TLS below
// 1.2, suites that are not approved (ChaCha20-Poly1305, CBC), and
// certificates or client CAs whose keys are not approved (pki.CheckFIPS*).
// Files are read once, here; one that cannot be read or parsed is left to
// its loader, which reports it. Content that changes later (a rewritten
// file, --tls-secret, --ca-secret) is not checked: crypto/tls refuses it at
// handshake time. It logs the mode once.
func (o *Options) validateFIPS() []error {
	if !fips140.Enabled() {
		return nil
	}
	mode := "fips140=on"
	if fips140.Enforced() {
		mode = "fips140=only"
	}
	logFIPSOnce.Do(func() {
		klog.Background().Info("FIPS 140-3 mode: only approved TLS versions, suites, groups and keys are used", "godebug", mode, "module", fips140.Version())
	})
	notApproved := fmt.Sprintf("not approved in FIPS 140-3 mode (GODEBUG=%s)", mode)
	var errs []error
	if v, err := cliflag.TLSVersion(o.MinTLSVersion); err == nil && v < tls.VersionTLS12 {
		errs = append(errs, fmt.Errorf("--tls-min-version: %s is %s; use VersionTLS12 or VersionTLS13", o.MinTLSVersion, notApproved))
	}
	if ids, err := cliflag.TLSCipherSuites(o.CipherSuites); err == nil {
		var bad []string
		for _, id := range ids {
			if !slices.Contains(fipsApprovedSuites, id) && len(insecureSuites([]uint16{id})) == 0 {
				bad = append(bad, tls.CipherSuiteName(id))
			}
		}
		if len(bad) > 0 {
			errs = append(errs, fmt.Errorf("--tls-cipher-suites: %s %s; approved: %s", strings.Join(bad, ", "), notApproved, strings.Join(acceptedCipherSuites(), ", ")))
		}
	}
	checkPair := func(flag, certFile, keyFile string) {
		certPEM, err := os.ReadFile(certFile)
		if err != nil {
			return
		}
		keyPEM, err := os.ReadFile(keyFile)
		if err != nil {
			return
		}
		if pair, err := tls.X509KeyPair(certPEM, keyPEM); err == nil {
			if err := pki.CheckFIPSKeyPair(pair); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w (GODEBUG=%s)", flag, certFile, err, mode))
			}
		}
	}
	if o.CertFile != "" {
		checkPair("--tls-cert-file", o.CertFile, o.KeyFile)
	}
	for i, nck := range o.SNICertKeys {
		checkPair(fmt.Sprintf("--tls-sni-cert-key[%d]", i), nck.CertFile, nck.KeyFile)
	}
	if o.ClientCAFile != "" {
		if bundle, err := os.ReadFile(o.ClientCAFile); err == nil {
			if cas, err := pki.ParseCABundle(bundle); err == nil {
				if err := pki.CheckFIPSCertificates(cas); err != nil {
					errs = append(errs, fmt.Errorf("--client-ca-file %s: %w (GODEBUG=%s): client certificates it signed can never be verified", o.ClientCAFile, err, mode))
				}
			}
		}
	}
	return errs
}
