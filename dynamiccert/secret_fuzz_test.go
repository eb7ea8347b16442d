package dynamiccert_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/evercert/evercert/dynamiccert"
	"github.com/evercert/evercert/internal/pki"
)

const (
	fuzzNamespace = "ns"
	fuzzSecret    = "fuzz"
	fuzzSecretKey = fuzzNamespace + "/" + fuzzSecret
)

// fuzzSecretNow is the fixed clock of FuzzSecretData.
var fuzzSecretNow = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// fuzzSecretObject builds the Secret; an empty slice leaves its key out.
func fuzzSecretObject(crt, key, ca []byte) *corev1.Secret {
	data := map[string][]byte{}
	for k, v := range map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, dynamiccert.SecretCAKey: ca} {
		if len(v) > 0 {
			data[k] = v
		}
	}
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: fuzzNamespace, Name: fuzzSecret},
		Type:       corev1.SecretTypeTLS,
		Data:       data,
	}
}

func fuzzSecretConfig(name string, client *fake.Clientset) dynamiccert.SecretConfig {
	return dynamiccert.SecretConfig{
		// Constant names: one metric series per provider kind, however many
		// inputs run.
		Name: name, Namespace: fuzzNamespace, SecretName: fuzzSecret, Client: client,
		Clock: clocktesting.NewFakeClock(fuzzSecretNow),
	}
}

// FuzzSecretData runs arbitrary tls.crt, tls.key and ca.crt through a
// SecretCertKey and a SecretCA (RunOnce on a fake clientset), both fresh and
// after a good Secret was loaded.
//
// Properties: no panic; on error the served content is unchanged (nil when
// nothing was ever loaded), the error names the Secret and holds no PEM
// armor; on success exactly the Secret's bytes are served.
func FuzzSecretData(f *testing.F) {
	ca, err := pki.NewCA(pki.Request{CommonName: "fuzz-ca", Now: fuzzSecretNow, Lifetime: 24 * time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	leaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "fuzz.test", DNSNames: []string{"fuzz.test"}, Now: fuzzSecretNow, Lifetime: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	rsaLeaf, err := pki.IssueLeaf(ca, pki.Request{CommonName: "rsa.test", KeyType: pki.RSA2048, Now: fuzzSecretNow, Lifetime: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	oldCA, err := pki.NewCA(pki.Request{CommonName: "old-ca", Now: fuzzSecretNow.Add(-2 * time.Hour), Lifetime: 24 * time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	expired, err := pki.IssueLeaf(oldCA, pki.Request{CommonName: "old.test", Now: fuzzSecretNow.Add(-2 * time.Hour), Lifetime: time.Hour})
	if err != nil {
		f.Fatal(err)
	}
	none := []byte{}
	for _, seed := range [][3][]byte{
		{leaf.CertPEM, leaf.KeyPEM, ca.CertPEM},
		{rsaLeaf.CertPEM, rsaLeaf.KeyPEM, append(bytes.Clone(ca.CertPEM), ca.CertPEM...)},
		{none, none, none},
		{leaf.CertPEM, none, ca.CertPEM},
		{none, leaf.KeyPEM, none},
		{leaf.CertPEM, leaf.KeyPEM, none},
		{none, none, ca.CertPEM},
		{[]byte("garbage"), []byte("garbage"), []byte("garbage")},
		{append(bytes.Clone(leaf.CertPEM), "junk"...), leaf.KeyPEM, append(bytes.Clone(ca.CertPEM), "junk"...)},
		{leaf.CertPEM, rsaLeaf.KeyPEM, ca.KeyPEM},
		{leaf.KeyPEM, leaf.CertPEM, leaf.KeyPEM},
		{expired.CertPEM, expired.KeyPEM, expired.CertPEM},
		{[]byte("\n \t"), []byte(" "), []byte("\n")},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}

	// Every rejected input is logged at error level once per provider;
	// keep the fuzzer's output readable and fast.
	state := klog.CaptureState()
	klog.LogToStderr(false)
	klog.SetOutput(io.Discard)
	f.Cleanup(state.Restore)

	// One fake clientset for every input: building one costs milliseconds
	// (it makes a REST mapper for the whole scheme) and its tracker's Update
	// runs structured-merge-diff, both heavy under fuzz instrumentation. A
	// reactor serves the current input to the providers' GET instead. Inputs
	// run one at a time in a fuzz worker, so a plain variable is enough.
	good := fuzzSecretObject(leaf.CertPEM, leaf.KeyPEM, ca.CertPEM)
	ctx := context.Background()
	client := fake.NewClientset(good.DeepCopy())
	current := good
	client.PrependReactor("get", "secrets", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if get, ok := action.(clienttesting.GetAction); !ok || get.GetNamespace() != fuzzNamespace || get.GetName() != fuzzSecret {
			return false, nil, nil
		}
		return true, current.DeepCopy(), nil
	})
	setSecret := func(secret *corev1.Secret) {
		current = secret
		client.ClearActions() // the fake records every call; keep memory flat
	}

	f.Fuzz(func(t *testing.T, crt, key, caBundle []byte) {
		in := fuzzSecretObject(crt, key, caBundle)

		checkErr := func(what string, err error) {
			t.Helper()
			msg := err.Error()
			if !strings.Contains(msg, fuzzSecretKey) {
				t.Fatalf("%s: error does not name the secret %s: %q", what, fuzzSecretKey, msg)
			}
			if strings.Contains(msg, "-----BEGIN") || strings.Contains(msg, "-----END") {
				t.Fatalf("%s: error holds PEM armor: %q", what, msg)
			}
		}

		// Fresh providers: nothing served before, nothing after a failure.
		setSecret(in)
		certKey, err := dynamiccert.NewSecretCertKey(fuzzSecretConfig("fuzz-secret-certkey", client))
		if err != nil {
			t.Fatal(err)
		}
		caProv, err := dynamiccert.NewSecretCA(fuzzSecretConfig("fuzz-secret-ca", client))
		if err != nil {
			t.Fatal(err)
		}
		if err := certKey.RunOnce(ctx); err != nil {
			checkErr("fresh cert/key", err)
			if c, k := certKey.CurrentCertKeyContent(); c != nil || k != nil || parsedPair(certKey) != nil {
				t.Fatal("fresh cert/key: content served after a failed load")
			}
			if certKey.LastError() == nil {
				t.Fatal("fresh cert/key: LastError is nil after a failure")
			}
		} else {
			if c, k := certKey.CurrentCertKeyContent(); !bytes.Equal(c, crt) || !bytes.Equal(k, key) || parsedPair(certKey) == nil {
				t.Fatal("fresh cert/key: loaded content differs from the secret")
			}
			if certKey.LastError() != nil {
				t.Fatal("fresh cert/key: LastError set after a success")
			}
		}
		if err := caProv.RunOnce(ctx); err != nil {
			checkErr("fresh CA", err)
			if caProv.CurrentCABundleContent() != nil {
				t.Fatal("fresh CA: content served after a failed load")
			}
			if _, ok := caProv.VerifyOptions(); ok {
				t.Fatal("fresh CA: verify options after a failed load")
			}
		} else if !bytes.Equal(caProv.CurrentCABundleContent(), caBundle) {
			t.Fatal("fresh CA: loaded content differs from the secret")
		}

		// Loaded providers: a failure keeps the last good content.
		setSecret(good)
		certKey, err = dynamiccert.NewSecretCertKey(fuzzSecretConfig("fuzz-secret-certkey", client))
		if err != nil {
			t.Fatal(err)
		}
		caProv, err = dynamiccert.NewSecretCA(fuzzSecretConfig("fuzz-secret-ca", client))
		if err != nil {
			t.Fatal(err)
		}
		if err := certKey.RunOnce(ctx); err != nil {
			t.Fatalf("good cert/key: %v", err)
		}
		if err := caProv.RunOnce(ctx); err != nil {
			t.Fatalf("good CA: %v", err)
		}
		setSecret(in)
		if err := certKey.RunOnce(ctx); err != nil {
			checkErr("loaded cert/key", err)
			if c, k := certKey.CurrentCertKeyContent(); !bytes.Equal(c, leaf.CertPEM) || !bytes.Equal(k, leaf.KeyPEM) {
				t.Fatal("loaded cert/key: served content changed after a failed load")
			}
			if cur := parsedPair(certKey); cur == nil || !bytes.Equal(cur.Leaf.Raw, leaf.Cert.Raw) {
				t.Fatal("loaded cert/key: parsed pair changed after a failed load")
			}
		} else if c, k := certKey.CurrentCertKeyContent(); !bytes.Equal(c, crt) || !bytes.Equal(k, key) {
			t.Fatal("loaded cert/key: new content not served after a success")
		}
		if err := caProv.RunOnce(ctx); err != nil {
			checkErr("loaded CA", err)
			if !bytes.Equal(caProv.CurrentCABundleContent(), ca.CertPEM) {
				t.Fatal("loaded CA: served content changed after a failed load")
			}
			if _, ok := caProv.VerifyOptions(); !ok {
				t.Fatal("loaded CA: verify options lost after a failed load")
			}
		} else if !bytes.Equal(caProv.CurrentCABundleContent(), caBundle) {
			t.Fatal("loaded CA: new content not served after a success")
		}
	})
}

// parsedPair returns the pair p serves, nil before its first good load.
func parsedPair(p *dynamiccert.SecretCertKey) *tls.Certificate {
	_, _, c := p.CurrentParsedCertKeyContent()
	return c
}
