package authority

import (
	"flag"
)

// LongScenarios runs the wall-clock scenario tests at their full size:
// more replicas, rotations and edits than make test runs, which covers
// their state space with the simulator (TestSimulate) instead. make soak
// sets it (-authority.long). Exported for the external test package.
var LongScenarios = flag.Bool("authority.long", false, "run the scenario tests at full size (make soak)")

// scenarioSize is n under LongScenarios, short otherwise.
func scenarioSize(short, n int) int {
	if *LongScenarios {
		return n
	}
	return short
}
