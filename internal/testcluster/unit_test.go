package testcluster

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// These tests need no binaries; the control plane itself is exercised by the
// e2e-tagged tests.

func TestFindBinDir(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvKubeBin, dir)
	_, err := findBinDir()
	if err == nil || !strings.Contains(err.Error(), "hack/install-kube.sh") {
		t.Fatalf("missing binaries: got error %v, want one pointing at hack/install-kube.sh", err)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	got, err := findBinDir()
	if err != nil || got != dir {
		t.Fatalf("findBinDir() = %q, %v; want %q", got, err, dir)
	}
}

func TestFindBinDirWalksUp(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "hack", "tools", "bin")
	sub := filepath.Join(root, "a", "b")
	for _, d := range []string{bin, sub} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(EnvKubeBin, "")
	t.Chdir(sub)
	if _, err := findBinDir(); err == nil || !strings.Contains(err.Error(), "hack/install-kube.sh") {
		t.Fatalf("empty hack/tools/bin: got error %v, want one pointing at hack/install-kube.sh", err)
	}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		if err := os.WriteFile(filepath.Join(bin, name), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := findBinDir(); err != nil || got != bin {
		t.Fatalf("findBinDir() = %q, %v; want %q", got, err, bin)
	}
}

func TestIssueChains(t *testing.T) {
	ca, err := issue(certSpec{commonName: "ca", isCA: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := issue(certSpec{commonName: "bob", organization: []string{"qa"}, client: true}, ca)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(leaf.certPEM, leaf.keyPEM)
	if err != nil {
		t.Fatalf("key pair: %v", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	if _, err := pair.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if got := pair.Leaf.Subject; got.CommonName != "bob" || len(got.Organization) != 1 || got.Organization[0] != "qa" {
		t.Fatalf("subject %v", got)
	}
}

func TestValidateUser(t *testing.T) {
	for _, u := range []User{{Name: ""}, {Name: "a,b"}, {Name: "a", Groups: []string{`g"`}}, {Name: "a", Groups: []string{""}}} {
		if validateUser(u) == nil {
			t.Errorf("validateUser(%+v) accepted an invalid user", u)
		}
	}
	if err := validateUser(User{Name: "alice", Groups: []string{"devs", "system:x"}}); err != nil {
		t.Errorf("valid user rejected: %v", err)
	}
}

func TestSameSet(t *testing.T) {
	if !sameSet([]string{"a", "b", "a"}, []string{"b", "a"}) || sameSet([]string{"a"}, []string{"a", "b"}) {
		t.Fatal("sameSet")
	}
}
