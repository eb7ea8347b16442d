package tlstest

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// KubeletWriteFile writes data as the file name of a projected volume
// rooted at root, the way the kubelet's atomic writer does: a new
// timestamped directory holding the file, the ..data symlink swapped to it
// with a rename, the user-visible name a symlink through ..data, and the
// previous directory removed. A reader never sees a half-written file, and
// a watch on the file itself loses it at every swap.
func KubeletWriteFile(t testing.TB, root, name string, data []byte) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("kubelet write of %s: %v", filepath.Join(root, name), err)
		}
	}
	must(os.MkdirAll(root, 0o755))
	ts, err := os.MkdirTemp(root, "..2026_"+time.Now().UTC().Format("01_02_15_04_05.000000000")+"_")
	must(err)
	ts = filepath.Base(ts)
	must(os.WriteFile(filepath.Join(root, ts, name), data, 0o600))
	old, _ := os.Readlink(filepath.Join(root, "..data"))
	must(os.Symlink(ts, filepath.Join(root, "..data_tmp")))
	must(os.Rename(filepath.Join(root, "..data_tmp"), filepath.Join(root, "..data")))
	if _, err := os.Lstat(filepath.Join(root, name)); errors.Is(err, fs.ErrNotExist) {
		must(os.Symlink(filepath.Join("..data", name), filepath.Join(root, name)))
	}
	if old != "" {
		must(os.RemoveAll(filepath.Join(root, old)))
	}
}
