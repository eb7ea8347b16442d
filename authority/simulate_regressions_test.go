package authority

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// simRegressions are the shrunk schedules of violations the simulator
// found (stop 34), each kept as it was printed: a plan's seed fixes the
// lags and jitter, so the schedule replays the interleaving that broke.
// Seeds no longer name these plans (later fault kinds re-drew every plan),
// so they are kept here, and each must now run clean.
var simRegressions = []struct {
	found string // what broke, and the fix
	plan  string // as simPlan.String prints it
}{
	{"S2: an emergency successor signed while a replica back from a pause had not read it (simulator: S2 judged at a CA's first leaf)",
		"seed 173: 2 replicas, publishers [r0], 40m0s CAs\n18m22s pause r1 for 29m13s\n22m33s pause r0 for 12m2s\n23m49s compromise\n25m39s pause r1 for 21m30s\n39m46s api r0 for 6m48s *:*:409"},
	{"S1: a replica cut off from the API served a compromised CA its peers drained (simulator: a compromised CA's leaves are the emergency's intent)",
		"seed 283: 3 replicas, publishers [r1 r2], 40m0s CAs\n14m7s stop r0 for 8m59s\n35m56s api r0 for 13m33s *:*:429\n36m44s compromise"},
	{"S3: rollouts faster than the lease duration with a killed replica's Lease stalled an emergency for good (first sight of a Lease)",
		"seed 399: 2 replicas, publishers [], 40m0s CAs\n17m43s api r1 for 14m47s *:*:429\n17m46s rollout for 5m45s x12\n26m20s compromise"},
	{"V1: overlapping pauses shortened each other (simulator)",
		"seed 610: 2 replicas, publishers [], 1h20m0s CAs\n8m6s pause r1 for 23m16s\n19m52s compromise\n22m15s pause r1 for 10s"},
	{"S3: a CA marked before the operator marked another was written back for good (the dropped list)",
		"seed 1268: 4 replicas, publishers [r0 r1], 1h20m0s CAs\n42m17s api r3 for 6m22s leases:*:403\n1h1m10s pause r1 for 21m6s\n1h4m11s compromise\n1h6m49s compromise"},
	{"S2: the flat two-interval first-sight rule stopped waiting for a replica whose Lease still held",
		"seed 1504: 3 replicas, publishers [r0 r2], 40m0s CAs\n14m33s rollout for 9m54s x6\n25m40s api r0 for 6m23s *:*:403"},
	{"V1: a conflict streak left the replica silent (LastError after a check interval)",
		"seed 1908: 1 replicas, publishers [r0], 40m0s CAs\n11m48s kill r0 for 8m9s new-id\n15m18s api r0 for 13m39s *:*:409\n18m25s compromise"},
	{"S2: a replica announcing a leaf of a drained CA counted as live (simulator)",
		"seed 2100: 4 replicas, publishers [r0 r1 r2 r3], 40m0s CAs\n3m28s pause r3 for 21m28s\n4m30s pause r1 for 20m3s\n7m54s compromise\n10m29s forge r2 unsigned\n23m5s compromise\n24m43s compromise"},
	{"V1: watch deliveries held during a pause were reordered (simulator)",
		"seed 3330: 3 replicas, publishers [r0 r1], 40m0s CAs\n17m32s pause r0 for 28m2s\n34m4s pause r0 for 12m26s\n37m59s compromise"},
	{"S2: a replica that cannot list the Leases promoted an emergency successor uncounted (observation.blind)",
		"seed 3375: 3 replicas, publishers [r1 r2], 40m0s CAs\n8m24s pause r1 for 12m29s\n23m11s api r1 for 12m29s leases:*:409\n41m42s rollout for 1m41s x10\n51m28s api r0 for 5m30s leases:*:403\n52m8s compromise"},
	{"S2: a replica without a leaf (unsigned announcement) counted as live (simulator)",
		"seed 5717: 5 replicas, publishers [r1 r2 r3], 1h0m0s CAs\n28m56s pause r3 for 21m23s\n37m28s rollout for 6m23s x8\n50m39s silent r3 for 34m13s\n51m42s compromise"},
	{"S1: a replica back from a cut-off said it was ready with a leaf of a CA just read (CatchingUp follows the leaf's CA)",
		"seed 6003: 3 replicas, publishers [], 40m0s CAs\n13m35s compromise\n39m47s api r1 for 12m36s *:*:403\n50m9s rotate"},
	{"S2: a rotation forced by the CA's end counted safe while a live replica lacked the successor (replicaSet.lacking)",
		"seed 9771: 2 replicas, publishers [r1], 40m0s CAs\n13m7s rotate\n38m57s api r0 for 14m26s secrets:get:403\n45m21s clock r1 -13s"},
	{"S2: a new process whose list of the Leases timed out promoted an emergency successor a live peer lacked (replicaSet: unlistedPeers)",
		"seed 4235: 6 replicas, publishers [r0 r1 r2 r4 r5], 1h0m0s CAs\n28m31s silent r5 for 52m50s\n32m32s rollout for 2m21s x12\n45m58s slow r4 for 7m55s leases:*:timeout\n48m43s compromise"},
	{"S2: an unsafe promotion whose write committed without an answer went uncounted (secretStore.countUnanswered)",
		"seed 599: 1 replicas, publishers [r0], 1h0m0s CAs\n42m54s kill r0 for 9m19s new-id\n53m12s stop r0 for 8m45s\n58m6s compromise\n1h3m5s slow r0 for 10m16s secrets:update:timeout"},
	{"S2: a promotion whose leaf the key store could not sign left Status and the Lease as before the check (issuer.adopt)",
		"seed 2361: 3 replicas, publishers [r2], 40m0s CAs, 3 faults, CA keys in a key store\n7m31s pause r2 for 20m41s\n10m17s compromise\n10m50s keys r0 for 17m42s hang"},
	{"S2: a peer signed with a CA whose unsafe promotion was recorded in the Secret before its writer counted it (simulator: the record counts)",
		"seed 2626: 3 replicas, publishers [r1], 40m0s CAs\n4m42s pause r1 for 18m43s\n9m28s compromise\n9m55s slow r0 for 11m4s secrets:*:timeout"},
	{"L1: a compromised CA pasted back after its emergency taken for a successor and promoted, and no replica would sign with it (emergency.decide)",
		"seed 2070: 5 replicas, publishers [r0 r1], 1h20m0s CAs\n47m22s paste\n54m56s compromise\n1h26m6s paste"},
	{"L1: a successor dropped in an emergency pasted back, promoted, and no replica would sign with it (emergency.decide)",
		"seed 2475: 2 replicas, publishers [r0 r1], 1h0m0s CAs\n56m48s paste\n59m24s compromise\n1h8m10s paste"},
	{"S2: the waiting successor copied into tls.crt by hand signed unobserved and uncounted while the only publisher was down (machine.handCopied)",
		"seed 3561: 3 replicas, publishers [r2], 1h0m0s CAs, 3 faults, ClusterTrustBundle [r2]\n52m3s pubdown r2 for 19m23s\n56m28s paste\n1h5m36s paste"},
	{"S2: a successor copied into tls.crt by hand signed uncounted while its target's only publisher was paused (machine.step: declared targets are observers for handCopied too)",
		"seed 2231: 2 replicas, publishers [r1], 40m0s CAs, 3 faults\n16m54s pause r1 for 24m51s\n17m52s paste\n36m18s paste"},
	{"V1: a replica back from a pause held the repair of a garbled ca.crt while it waited for a paused peer's next renewal, and said nothing (secretStore.updateOnce: a held repair is Broken)",
		"seed 15137: 2 replicas, publishers [r1], 40m0s CAs, 6 faults, ClusterTrustBundle [r0 r1]\n15m55s pause r1 for 17m19s\n23m29s paste\n32m56s pause r0 for 16m0s\n40m23s pause r1 for 14m7s\n46m13s garble ca.crt\n49m21s pause r1 for 10m27s"},
	{"S1: a restored backup demoted a promoted successor, and an emergency dropped it from ca.crt while its leaves were served (machine.restore: a backup from before a promotion is a rollback)",
		"seed 102788: 3 replicas, publishers [r0 r1], 1h0m0s CAs, 3 faults\n39m15s slow r2 for 5m3s *:*:timeout\n49m43s restore from 4m58s ago\n53m2s compromise"},
	{"L1: a hot loop: a compromised CA written back while a peer drained it (machine.restore: only when the Secret went back in time)",
		"seed 190: 8 replicas, publishers [r2 r3 r4 r6 r7], 40m0s CAs, 4 faults, CA keys in a key store, ClusterTrustBundle [r1 r2 r4 r6]\n30m12s forge r1 garbled\n34m59s rollout for 8m54s x2\n35m12s slow r5 for 9m43s leases:*:timeout\n46m31s compromise"},
	{"S2: a replica whose clock ran fast counted a peer gone while the peer's Lease still held, and promoted an emergency's successor under it (replicaSet.waitedForLocked: the skew tolerance past the lease duration)",
		"seed 5033: 10 replicas, publishers [r0 r3 r4 r6], 1h0m0s CAs, 6 faults, ClusterTrustBundle [r3 r4 r5 r6 r9]\n5m15s compromise\n7m6s rotate\n15m17s drift r8 294ms\n20m17s api r8 for 12m36s leases:*:403\n29m42s slow r3 for 6m43s *:*:timeout\n35m36s compromise"},
	{"S2: a replica whose clock stepped back (within the tolerance) while its calls timed out was counted gone while its Lease held, and an emergency's successor signed under it (replicaSet.waitedForLocked)",
		"seed 200906: 6 replicas, publishers [r0 r3 r5], 40m0s CAs, 3 faults\n35m50s slow r4 for 12m49s *:*:timeout\n35m55s clock r4 -13s\n37m6s compromise"},
	{"S2: clocks within the tolerance of each other moved 44 s apart over one lease, more than a margin of one tolerance (review of stop 39; leaseMargin: twice the tolerance)",
		"seed 200900: 6 replicas, publishers [r0 r3 r5], 40m0s CAs\n35m30s clock r4 14s\n35m50s slow r4 for 12m49s *:*:timeout\n35m55s clock r4 -15s\n35m56s clock r4 -15s\n36m31s clock r5 15s\n37m6s compromise"},
	{"L1: the margin added on top of the first-sight floor let a killed replica's Lease hold a routine rotation through rollouts every 5 minutes (review of stop 39; observeLocked: the margin is folded into the first-sight wait)",
		"seed 18726: 5 replicas, publishers [r0 r3], 1h20m0s CAs, 3 faults, CA keys in a key store\n25m10s rotate\n34m5s kill r4 for 5m58s new-id\n1h10m31s rollout for 5m0s x8"},
	{"L1: a replica whose Secret watch was silent put a dropped compromised CA back into the caBundle at every check, and the others took it out again (simulator: publishers keep cabundle's replicaGrace)",
		"seed 24771: 5 replicas, publishers [r0 r1 r2 r3 r4], 40m0s CAs, 9 faults\n4m39s keys r4 for 23m17s hang\n14m13s rotate\n30m32s kill r0 for 6m5s new-id\n30m39s silent r0 for 15m57s\n32m0s silent r3 for 29m36s\n34m57s silent r0 for 5m56s\n37m32s compromise\n38m8s rollout for 7m54s x9\n51m1s silent r1 for 27m0s"},
	{"L1: a killed replica's Lease held a routine rotation through rollouts every 4m30s, shorter than a first-seen Lease's wait (replicaSet.expireDeadOnServerLocked: the API server's write times date it)",
		"seed 18726: 5 replicas, publishers [r0 r3], 1h20m0s CAs, 10 faults, CA keys in a key store\n19m11s compromise\n24m44s drift r4 -27ms\n25m10s rotate\n31m22s api r3 for 13m44s secrets:get:409\n34m5s kill r4 for 5m58s new-id\n37m35s stop r3 for 6m15s\n48m43s stop r4 for 8m8s\n50m2s pause r3 for 25m46s\n1h2m3s stop r1 for 55s\n1h10m31s rollout for 4m30s x8"},
	{"S3: a mark made and taken away by a restored backup while the only replica's reads failed, judged as if a replica had read it (simulator: forgetUnreadMarks)",
		"seed 20481: 1 replicas, publishers [], 1h20m0s CAs, 3 faults\n1h2m33s api r0 for 6m32s *:*:500\n1h5m44s compromise\n1h7m5s restore from 16m8s ago"},
	{"S2: a replica live for less than a watch delivery counted as live (simulator)",
		"seed 16249: 5 replicas, publishers [r0 r1 r2 r3], 40m0s CAs\n0s compromise"},
}

// parseSimPlan reads a plan as simPlan.String prints it (the fault count
// may be left out).
func parseSimPlan(s string) (simPlan, error) {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	var p simPlan
	// "seed N: R replicas, publishers [r0 r2], 40m0s CAs[, K faults]"
	head := strings.Split(lines[0], ", ")
	if len(head) < 3 {
		return p, fmt.Errorf("plan head %q", lines[0])
	}
	if _, err := fmt.Sscanf(head[0], "seed %d: %d replicas", &p.Seed, &p.Replicas); err != nil {
		return p, fmt.Errorf("plan head %q: %w", lines[0], err)
	}
	p.KeyStore = slices.Contains(head, "CA keys in a key store")
	for _, h := range head[3:] {
		if ctb, ok := strings.CutPrefix(h, "ClusterTrustBundle ["); ok {
			for _, f := range strings.Fields(strings.TrimSuffix(ctb, "]")) {
				var i int
				if _, err := fmt.Sscanf(f, "r%d", &i); err != nil || i >= p.Replicas {
					return p, fmt.Errorf("ClusterTrustBundle publisher %q", f)
				}
				if p.CTB == nil {
					p.CTB = make([]bool, p.Replicas)
				}
				p.CTB[i] = true
			}
		}
	}
	pubs := strings.TrimSuffix(strings.TrimPrefix(head[1], "publishers ["), "]")
	ca := strings.TrimSuffix(head[2], " CAs")
	p.Publishers = make([]bool, p.Replicas)
	for _, f := range strings.Fields(pubs) {
		var i int
		if _, err := fmt.Sscanf(f, "r%d", &i); err != nil || i >= p.Replicas {
			return p, fmt.Errorf("publisher %q", f)
		}
		p.Publishers[i] = true
	}
	d, err := time.ParseDuration(ca)
	if err != nil {
		return p, fmt.Errorf("CA lifetime %q: %w", ca, err)
	}
	if d != simConfigs[0].CALifetime {
		p.CALifetime = d
	}
	if _, ok := simConfigs[p.CALifetime]; !ok {
		return p, fmt.Errorf("CA lifetime %v is not one of simCALifetimes", d)
	}
	for _, l := range lines[1:] {
		w := strings.Fields(l)
		if len(w) < 2 {
			return p, fmt.Errorf("fault %q", l)
		}
		f := simFault{Slot: -1, Kind: w[1]}
		if f.At, err = time.ParseDuration(w[0]); err != nil {
			return p, fmt.Errorf("fault %q: %w", l, err)
		}
		w = w[2:]
		if len(w) > 0 && strings.HasPrefix(w[0], "r") {
			if _, err := fmt.Sscanf(w[0], "r%d", &f.Slot); err != nil {
				return p, fmt.Errorf("fault %q: %w", l, err)
			}
			w = w[1:]
		}
		if len(w) >= 2 && w[0] == "for" {
			if f.Dur, err = time.ParseDuration(w[1]); err != nil {
				return p, fmt.Errorf("fault %q: %w", l, err)
			}
			w = w[2:]
		}
		f.Arg = strings.Join(w, " ")
		p.Faults = append(p.Faults, f)
	}
	return p, nil
}

// TestSimulateRegressions replays every schedule in simRegressions: each
// broke an invariant once, and must run clean now.
func TestSimulateRegressions(t *testing.T) {
	for _, r := range simRegressions {
		plan, err := parseSimPlan(r.plan)
		if err != nil {
			t.Fatalf("%s: %v", r.found, err)
		}
		if got := plan.String(); !strings.HasPrefix(got, strings.SplitN(r.plan, "\n", 2)[0]) {
			t.Fatalf("%s: the plan reads back as %q", r.found, got)
		}
		if v, _ := simRun(plan, "", nil); v != nil {
			t.Errorf("%s\n  %v\n  replay: %s", r.found, v, plan)
		}
	}
}
