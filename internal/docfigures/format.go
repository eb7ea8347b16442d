package docfigures

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sig3 writes x with three significant digits, trailing zeros after the
// point dropped: 803, 24.1, 1.06, 0.4.
func sig3(x float64) string {
	var s string
	switch a := math.Abs(x); {
	case a >= 100 || a == 0:
		s = strconv.FormatFloat(x, 'f', 0, 64)
	case a >= 10:
		s = strconv.FormatFloat(x, 'f', 1, 64)
	case a >= 1:
		s = strconv.FormatFloat(x, 'f', 2, 64)
	default:
		s = strconv.FormatFloat(x, 'g', 3, 64)
	}
	if strings.Contains(s, ".") && !strings.ContainsAny(s, "e") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// seconds writes a duration given in seconds in ns, µs, ms or s.
func seconds(x float64) string {
	switch {
	case x < 1e-6:
		return sig3(x*1e9) + " ns"
	case x < 1e-3:
		return sig3(x*1e6) + " µs"
	case x < 1:
		return sig3(x*1e3) + " ms"
	}
	return sig3(x) + " s"
}

// millis writes a duration given in milliseconds, as seconds() does.
func millis(x float64) string { return seconds(x / 1e3) }

// bytes writes a size in B, KiB, MiB or GiB.
func bytes(x float64) string {
	switch {
	case x < 1<<10:
		return sig3(x) + " B"
	case x < 1<<20:
		return sig3(x/(1<<10)) + " KiB"
	case x < 1<<30:
		return sig3(x/(1<<20)) + " MiB"
	}
	return sig3(x/(1<<30)) + " GiB"
}

// count writes a count as a whole number with thousands separators:
// 1,003; 197.5 rounds to 198.
func count(x float64) string {
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// allocs writes "N allocs" ("1 alloc").
func allocs(x float64) string {
	if math.Round(x) == 1 {
		return "1 alloc"
	}
	return count(x) + " allocs"
}

// ratio writes a ratio near 1 with two decimals.
func ratio(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }

// times writes how many times faster: "151x".
func times(x float64) string {
	if x >= 10 {
		return strconv.FormatFloat(x, 'f', 0, 64) + "x"
	}
	return strconv.FormatFloat(x, 'f', 1, 64) + "x"
}

// ci writes benchstat's interval, " ± 3 %", or nothing when there is none
// (fewer than six runs) or it is 0.
func ci(v Value) string {
	if v.CI <= 0 {
		return ""
	}
	return fmt.Sprintf(" ± %s %%", strconv.FormatFloat(v.CI, 'f', -1, 64))
}
