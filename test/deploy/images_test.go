package deploy

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"debug/elf"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/evercert/evercert/internal/backoff"
	"github.com/evercert/evercert/internal/pki"
	"github.com/evercert/evercert/internal/proctest"
	"github.com/evercert/evercert/internal/testcluster"
	"github.com/evercert/evercert/test/deploy/image"
)

// servingLine is the log line of every example that says where it listens
// (--secure-port=0 picks a free port).
var servingLine = regexp.MustCompile(`serving on https://([0-9.:\[\]a-f]+)`)

// readyTimeout bounds the wait for /readyz: a hang guard on a loaded
// machine, not a timed assertion.
const readyTimeout = 3 * time.Minute

// TestImagesServe builds each example's image as make image does (static
// binary, one layer on an empty base, OCI layout), reads it back from the
// layout, unpacks its layers into a fresh root and starts the entrypoint
// named by the image config, then proves it serves: a TLS handshake
// verified against the CA the program uses, and /readyz 200.
//
//   - server: its embedded self-signed default (the CA from --ca-bundle-file).
//   - webhook, signer, apiserver: with the arguments of their Deployment, as
//     their ServiceAccount (the kubeconfig impersonates it) against a real
//     kube-apiserver holding the base, applied for real. Ready means the
//     program did everything it does at start with the base's RBAC and
//     nothing more: the webhook and the signer filled the pre-created CA
//     Secret (no create on secrets) and published the CA bundle, the
//     apiserver registered its APIService.
//
// The images build (one go build) while the kube-apiserver starts, and the
// examples run side by side: each has its own namespace, ServiceAccount and
// objects, and most of each subtest is waiting on a child process.
func TestImagesServe(t *testing.T) {
	startImages(t)
	c := testcluster.Start(t)
	cfg := c.Config()
	cs := kubernetes.NewForConfigOrDie(cfg)
	a := newApplier(t, cfg)

	t.Run("server", func(t *testing.T) {
		t.Parallel()
		u := checkImage(t, "server")
		caFile := filepath.Join(t.TempDir(), "ca.crt")
		_, addr := proctest.Start(t, u.bin(), servingLine, "--bind-address=127.0.0.1", "--secure-port=0", "--ca-bundle-file="+caFile)
		waitReady(t, addr, "127.0.0.1", func() ([]byte, error) { return os.ReadFile(caFile) })
	})
	for _, b := range bases {
		t.Run(b.dir, func(t *testing.T) {
			t.Parallel()
			u := checkImage(t, b.dir)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			objs := render(t, b.dir)
			createNamespaces(ctx, t, cs, objs)
			for _, o := range objs {
				if _, err := a.apply(ctx, o, false); err != nil {
					t.Fatalf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
				}
			}
			d := one[appsv1.Deployment](t, objs, "Deployment")
			dir := t.TempDir()
			// The Deployment's arguments, then what differs outside a pod:
			// loopback, a free port, a kubeconfig instead of the in-cluster
			// config, files the pod would mount.
			args := append(slices.Clone(d.Spec.Template.Spec.Containers[0].Args),
				"--bind-address=127.0.0.1", "--secure-port=0",
				"--kubeconfig="+serviceAccountKubeconfig(t, c, dir, b.namespace, b.serviceAccount))
			var serverName string
			var bundle func() ([]byte, error)
			switch b.dir {
			case "webhook", "signer":
				serverName = flagValue(args, "--self-signed-hosts")
				secretNS, secretName, _ := strings.Cut(flagValue(args, "--ca-secret"), "/")
				bundle = func() ([]byte, error) {
					s, err := cs.CoreV1().Secrets(secretNS).Get(ctx, secretName, metav1.GetOptions{})
					if err != nil {
						return nil, err
					}
					return s.Data["ca.crt"], nil
				}
				if b.dir == "signer" {
					cm := one[corev1.ConfigMap](t, objs, "ConfigMap")
					policy := filepath.Join(dir, "policy.yaml")
					if err := os.WriteFile(policy, []byte(cm.Data["policy.yaml"]), 0o644); err != nil {
						t.Fatal(err)
					}
					args = append(args, "--policy="+policy)
				}
			case "apiserver":
				// What the kubelet would project: the signer's leaf for the
				// Service name (key and chain in one file) and its CA bundle.
				svc := one[corev1.Service](t, objs, "Service")
				serverName = svc.Name + "." + svc.Namespace + ".svc"
				caPEM, bundlePEM := issueFor(t, serverName)
				caFile, bundleFile := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "credentialbundle.pem")
				if err := os.WriteFile(caFile, caPEM, 0o644); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(bundleFile, bundlePEM, 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--tls-cert-file="+bundleFile, "--tls-private-key-file="+bundleFile, "--apiservice-ca-file="+caFile)
				bundle = func() ([]byte, error) { return caPEM, nil }
			}
			_, addr := proctest.Start(t, u.bin(), servingLine, args...)
			waitReady(t, addr, serverName, bundle)
			if b.dir == "apiserver" {
				// It registers: the APIService it updates carries the CA.
				// Registration runs beside serving (readiness does not wait
				// for it, and it retries with backoff), so a loaded machine
				// may see /readyz before the update: wait, bounded.
				deadline := time.Now().Add(time.Minute)
				for {
					got, err := a.dyn.Resource(apiServicesGVR).Get(ctx, "v1alpha1.certificates.evercert.io", metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if ca, _, _ := unstructuredString(got.Object, "spec", "caBundle"); ca != "" {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("APIService has no caBundle a minute after the apiserver became ready")
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
}

// checkImage builds and unpacks the image, and checks its config and that
// the binary is static (no ELF interpreter: it runs on an empty base).
func checkImage(t *testing.T, name string) *unpacked {
	t.Helper()
	u := exampleImage(t, name)
	if u.user != image.User {
		t.Errorf("image %s: user %q, want %q", name, u.user, image.User)
	}
	f, err := elf.Open(u.bin())
	if err != nil {
		t.Fatalf("image %s: entrypoint %s: %v", name, u.entrypoint[0], err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("image %s: %s is dynamically linked (it has an ELF interpreter); the empty base has no libc", name, u.entrypoint[0])
		}
	}
	t.Logf("image %s: layout %s, entrypoint %v, user %s", name, u.layout, u.entrypoint, u.user)
	return u
}

// waitReady polls https://addr/readyz until it answers 200, each time over
// a fresh TLS connection verified against the bundle bundle returns (which
// may not exist yet) for serverName. The polls back off from 50 ms to 1 s:
// a program that is ready within moments is seen so, and a slow one is not
// hammered.
func waitReady(t *testing.T, addr, serverName string, bundle func() ([]byte, error)) {
	t.Helper()
	var last string
	poll := func() (bool, error) {
		pem, err := bundle()
		if err != nil || len(pem) == 0 {
			last = fmt.Sprintf("no CA bundle yet: %v", err)
			return false, nil
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return false, fmt.Errorf("the CA bundle holds no certificate")
		}
		tlsCfg := &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}
		if ip := net.ParseIP(serverName); ip != nil {
			tlsCfg.ServerName = ""
		}
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true}}
		resp, err := client.Get("https://" + addr + "/readyz?verbose")
		if err != nil {
			last = err.Error()
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			last = fmt.Sprintf("%s: %s", resp.Status, body)
			return false, nil
		}
		if resp.TLS == nil || len(resp.TLS.VerifiedChains) == 0 {
			return false, fmt.Errorf("no verified chain")
		}
		t.Logf("https://%s/readyz: 200 over %s, leaf %q verified for %s", addr, tls.VersionName(resp.TLS.Version), resp.TLS.PeerCertificates[0].Subject.CommonName, serverName)
		return true, nil
	}
	deadline := time.NewTimer(readyTimeout)
	defer deadline.Stop()
	b := backoff.New(50*time.Millisecond, time.Second)
	for {
		ok, err := poll()
		if err != nil {
			t.Fatalf("https://%s/readyz: %v", addr, err)
		}
		if ok {
			return
		}
		select {
		case <-deadline.C:
			t.Fatalf("https://%s/readyz never answered 200 within %s; last: %s", addr, readyTimeout, last)
		case <-time.After(b.Next(nil)):
		}
	}
}

// serviceAccountKubeconfig writes a kubeconfig that talks to c as the
// ServiceAccount ns/sa: the admin's token impersonating
// system:serviceaccount:<ns>:<sa> (the API server adds the ServiceAccount
// groups), so every request is authorized as the pod's would be.
func serviceAccountKubeconfig(t *testing.T, c *testcluster.Cluster, dir, ns, sa string) string {
	t.Helper()
	admin := c.Config()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: admin.Host, CertificateAuthorityData: admin.CAData}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: admin.BearerToken, Impersonate: "system:serviceaccount:" + ns + ":" + sa}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "sa"}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// issueFor returns a CA and, in one PEM file as a podCertificate volume
// holds them, a leaf for name signed by it with its key.
func issueFor(t *testing.T, name string) (caPEM, bundlePEM []byte) {
	t.Helper()
	now := time.Now()
	ca, err := pki.NewCA(pki.Request{CommonName: "test signer", Now: now, Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: name, DNSNames: []string{name}, Now: now, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return ca.CertPEM, append(slices.Clone(leaf.KeyPEM), leaf.CertPEM...)
}
