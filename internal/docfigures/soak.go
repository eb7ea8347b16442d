package docfigures

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Soak is one run of the soak (make soak-run): its settings and the lines
// of its log the figures come from.
type Soak struct {
	// Run holds the "key: value" lines before the first blank line of the
	// record: date, command.
	Run map[string]string
	// Lines are the report lines (see SoakLine).
	Lines []string
}

// SoakLine matches the lines of a soak log that make docs-figures keeps:
// the report lines, each fault kind's busiest loop, and the top-level test
// results with their wall time.
var SoakLine = regexp.MustCompile(`soak report |busiest loop past the ramp|^--- (PASS|FAIL): TestSoak\w+ \(|^(ok|FAIL)\s`)

// ParseSoak parses a soak record: "key: value" lines, a blank line, then
// the kept log lines.
func ParseSoak(text string) (*Soak, error) {
	head, body, ok := strings.Cut(text, "\n\n")
	if !ok {
		return nil, fmt.Errorf("soak record: no blank line after the settings")
	}
	run, err := ParseRun(head)
	if err != nil {
		return nil, fmt.Errorf("soak record settings: %w", err)
	}
	s := &Soak{Run: run}
	for _, l := range strings.Split(body, "\n") {
		if strings.TrimSpace(l) != "" {
			s.Lines = append(s.Lines, strings.TrimSpace(l))
		}
	}
	return s, nil
}

// find returns the submatches of the first line re matches, or nil.
func (s *Soak) find(re *regexp.Regexp) []string {
	for _, l := range s.Lines {
		if m := re.FindStringSubmatch(l); m != nil {
			return m
		}
	}
	return nil
}

var (
	soakFaults    = regexp.MustCompile(`soak report faults: (\d+) scenarios x (\d+) cycles, simulated \S+ \(([\d.]+) years\), rotations (\d+), handshakes (\d+), API calls (\d+), unsafe rotations (\d+), hot loops (\d+), failures (\d+)`)
	soakScenario  = regexp.MustCompile(`soak report fault/(\S+): .* unsafe rotations (\d+),`)
	soakRun       = regexp.MustCompile(`soak report (simulated|real-time): rotations (\d+) map\[([^\]]*)\], handshakes (\d+), requests (\d+), failures (\d+), goroutines (\d+) -> (\d+), heap in use (\d+) KiB -> (\d+) KiB`)
	soakBusiest   = regexp.MustCompile(`^(?:\S+: )?([\w-]+): \d+ requests in \S+ of (\S+) faults .*busiest loop past the ramp: [^,]+, ([\d.]+)/min`)
	soakAtRest    = regexp.MustCompile(`soak report budget/(\S+) cycle \d+: at rest (\d+) replicas x (\d+) min: .* = ([\d.]+) requests per replica per minute; CPU (\S+) per replica per minute; heap in use (\d+) KiB per replica`)
	soakRotation  = regexp.MustCompile(`soak report budget/\S+ cycle \d+: one CA rotation, (\d+) replicas: .*; (\d+) requests beyond the renewals \(([\d.]+) per replica\)`)
	soakPromotion = regexp.MustCompile(`soak report budget/\S+ cycle \d+: promoted (\S+) after the API server answered again`)
	soakWall      = regexp.MustCompile(`^--- (PASS|FAIL): (TestSoak\w+) \(([\d.]+)s\)`)
)

// wall returns how long a top-level soak test took and whether it passed,
// as "6m44s, passed".
func (s *Soak) wall(test string) string {
	for _, l := range s.Lines {
		m := soakWall.FindStringSubmatch(l)
		if m == nil || m[2] != test {
			continue
		}
		sec, _ := strconv.ParseFloat(m[3], 64)
		d := fmt.Sprintf("%dm%02ds", int(sec)/60, int(sec)%60)
		if sec < 60 {
			d = fmt.Sprintf("%.0f s", sec)
		}
		return d + ", " + map[string]string{"PASS": "passed", "FAIL": "FAILED"}[m[1]]
	}
	return "not in the recorded run"
}

func num(s string) float64 {
	x, _ := strconv.ParseFloat(s, 64)
	return x
}

// SoakBlock renders the block "soak": what one soak run reported.
func SoakBlock(s *Soak) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make docs-figures` (`%s`) on %s. Each item names its test in `test/soak` (build tag `soak`).\n\n", s.Run["command"], s.Run["date"])
	if m := s.find(soakFaults); m != nil {
		var unsafeIn []string
		for _, l := range s.Lines {
			if sm := soakScenario.FindStringSubmatch(l); sm != nil && sm[2] != "0" {
				unsafeIn = append(unsafeIn, fmt.Sprintf("%s (%s)", sm[1], sm[2]))
			}
		}
		unsafe := m[7] + " unsafe rotations"
		if len(unsafeIn) > 0 {
			unsafe += ", reported as such, all in scenarios that pause longer than they may: " + strings.Join(unsafeIn, ", ")
		}
		fmt.Fprintf(&b, "- Fault soak, `TestSoakFaults` (real Run loops, Authority replicas on a fake API server with optimistic concurrency, real files, the caBundle publisher, a stepped fake clock; %s): %s scenarios x %s, %s simulated years, %s rotations, %s real handshakes, %s API calls, %s hot loops, %s failures; %s.\n",
			s.wall("TestSoakFaults"), m[1], plural(m[2], "cycle"), m[3], count(num(m[4])), count(num(m[5])), count(num(m[6])), m[8], m[9], unsafe)
	}
	var busiest []string
	for _, l := range s.Lines {
		if m := soakBusiest.FindStringSubmatch(l); m != nil {
			busiest = append(busiest, fmt.Sprintf("%s %s", m[2], m[3]))
		}
	}
	if len(busiest) > 0 {
		fmt.Fprintf(&b, "- The same, API faults: past the backoff ramp, the busiest loop's requests per simulated minute under each fault: %s.\n", strings.Join(busiest, ", "))
	}
	for _, l := range s.Lines {
		m := soakRun.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		rotations, failures := plural(count(num(m[2])), "rotation"), m[6]
		flat := fmt.Sprintf("goroutines %s -> %s, heap in use %s -> %s", m[7], m[8], bytes(num(m[9])*1024), bytes(num(m[10])*1024))
		if m[1] == "real-time" {
			fmt.Fprintf(&b, "- Real clock, `TestSoakRealTime` (the server's self-signed certificate lives 3 s, its clients re-read the CA bundle file before every request; %s): %s, %s HTTPS requests, %s failures; %s.\n",
				s.wall("TestSoakRealTime"), rotations, count(num(m[5])), failures, flat)
			continue
		}
		fmt.Fprintf(&b, "- Simulated years, `TestSoakSimulatedYears` (daily steps on a fake clock, every provider's Run loop, real TLS clients; %s): %s across %s, %s real handshakes, %s loopback requests, %s failures; %s.\n",
			s.wall("TestSoakSimulatedYears"), rotations, plural(strconv.Itoa(len(strings.Fields(m[3]))), "provider"), count(num(m[4])), count(num(m[5])), failures, flat)
	}
	if m := s.find(soakAtRest); m != nil {
		fmt.Fprintf(&b, "- Scale, `TestSoakFaults/%s` (%s replicas on the fake API server, one cycle): at rest for %s min, %s requests per replica per minute, CPU %s per replica per minute, heap in use %s per replica",
			m[1], m[2], m[3], m[4], m[5], bytes(num(m[6])*1024))
		if r := s.find(soakRotation); r != nil {
			fmt.Fprintf(&b, "; one CA rotation: %s requests beyond the renewals (%s per replica)", count(num(r[2])), r[3])
		}
		if p := s.find(soakPromotion); p != nil {
			fmt.Fprintf(&b, "; promoted %s after the API server answered again", p[1])
		}
		b.WriteString(".\n")
	}
	return b.String()
}

// plural writes n and word, with an s unless n is 1.
func plural(n, word string) string {
	if n == "1" {
		return n + " " + word
	}
	return n + " " + word + "s"
}
