//go:build e2e

package e2e

import (
	"os"
	"testing"

	"github.com/evercert/evercert/internal/proctest"
)

func TestMain(m *testing.M) { os.Exit(proctest.Main(m)) }
