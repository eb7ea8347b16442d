package pkcs11_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/evercert/evercert/pkcs11"
)

// Every test of this package shares one SoftHSM2 configuration, in a
// temporary directory: the library reads SOFTHSM2_CONF once per process.
// Each test makes its own token there, under a label of its own, so tests
// do not share keys and may run in parallel; nothing outside the temporary
// directory is touched.
var (
	tokenDir string
	tokenSeq atomic.Int64
)

const (
	userPIN = "1234"
	soPIN   = "5678"
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		// A child process of a test (twoprocess_test.go), on the
		// configuration and token of its parent.
		os.Exit(childMain(mode))
	}
	dir, err := os.MkdirTemp("", "evercert-softhsm-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	tokenDir = filepath.Join(dir, "tokens")
	conf := filepath.Join(dir, "softhsm2.conf")
	if err = os.MkdirAll(tokenDir, 0o700); err == nil {
		err = os.WriteFile(conf, []byte("directories.tokendir = "+tokenDir+"\nobjectstore.backend = file\nlog.level = ERROR\n"), 0o600)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Setenv("SOFTHSM2_CONF", conf)
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newToken initializes a fresh token with softhsm2-util and returns its
// label and a PIN file holding its user PIN.
func newToken(t testing.TB) (label, pinFile string) {
	t.Helper()
	label = fmt.Sprintf("%s-%d", t.Name(), tokenSeq.Add(1))
	if len(label) > 32 { // CK_TOKEN_INFO.label is 32 bytes
		label = fmt.Sprintf("evercert-test-%d", tokenSeq.Add(1))
	}
	out, err := initTokenCmd(label).CombinedOutput()
	if err != nil {
		t.Fatalf("softhsm2-util --init-token %s: %v\n%s", label, err, out)
	}
	pinFile = filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(pinFile, []byte(userPIN+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return label, pinFile
}

// initTokenCmd initializes a token labelled label in the first free slot.
func initTokenCmd(label string) *exec.Cmd {
	return exec.Command("softhsm2-util", "--init-token", "--free", "--label", label, "--pin", userPIN, "--so-pin", soPIN)
}

// newKeySource opens the token labelled label; Close is a cleanup.
func newKeySource(t testing.TB, label, pinFile string) *pkcs11.KeySource {
	t.Helper()
	ks, err := pkcs11.New(pkcs11.Config{TokenLabel: label, PINFile: pinFile})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ks.Close() })
	return ks
}
