package authority

import (
	"fmt"
	"strings"
	"testing"
)

// TestSimulatorJudgesDroppedSuccessors: a successor pending when
// the signing CA was marked compromised is dropped (its key sat beside the
// compromised one) and must never sign. A backup from between its
// publication (a rotate request) and the mark, restored after the
// emergency, brings it back with no record of the drop, and the replicas
// promote it after its delay (the library defect of
// TestBackupWithPendingSuccessorKeepsTheDroppedSuccessorOut).
// The simulator's S3 judges only the marked CAs (w.marked), and
// stillValid reads the dropped list from the Secret as it is now, which
// the restore rewrote: it reports nothing. Either the library keeps the
// dropped successor out (then no replica signs with it), or the simulator
// must report it.
func TestSimulatorJudgesDroppedSuccessors(t *testing.T) {
	plan, err := parseSimPlan("seed 7: 3 replicas, publishers [r0], 40m0s CAs, 3 faults\n5m rotate\n6m compromise\n10m restore from 4m30s ago")
	if err != nil {
		t.Fatal(err)
	}
	w := newSimWorld(plan, "", nil)
	dropped := map[string]bool{} // short fingerprints ever in the Secret's dropped list
	var signed []string
	w.logf = func(format string, args ...any) {
		if w.secret != nil {
			for _, d := range parseOperatorRequests(w.secret).dropped {
				dropped[short(d)] = true
			}
		}
		line := fmt.Sprintf(format, args...)
		if _, after, ok := strings.Cut(line, " signs with "); ok && dropped[strings.Fields(after)[0]] {
			signed = append(signed, strings.TrimSpace(line))
		}
	}
	v, _ := w.run()
	if len(signed) > 0 && v == nil {
		t.Errorf("replicas signed with a successor dropped in an emergency and the simulator reported no violation:\n  %s\n  replay: %s", strings.Join(signed, "\n  "), plan)
	}
}
