#!/usr/bin/env bash
# gotest.sh LOG CMD...: runs a test command with its whole output in LOG, and
# on failure prints what a reader of CI needs at the end, where a CI log that
# keeps only the tail still shows it: each failing test with its messages and
# each panic, without the klog lines that interleave with them, then the
# packages that failed. The exit status is the command's.
set -uo pipefail
log=$1
shift
mkdir -p "$(dirname "$log")"
"$@" >"$log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
	grep -E '^ok ' "$log"
	exit 0
fi
# klog's header: severity letter, MMDD, time, thread id, file:line].
klog='^[IWEF][0-9]{4} [0-9:.]+ +[0-9]+ [^ ]+:[0-9]+\] '
echo "---- $* failed (exit $rc); whole output in $log; its last lines:"
grep -vE "$klog" "$log" | tail -40
echo "---- failing tests, panics and timeouts:"
grep -vE "$klog" "$log" | grep -E -A40 '^ *--- FAIL|^panic:|^fatal error:|test timed out' | head -400
# Under -v, a parallel test's messages come in blocks headed "=== NAME  X"
# (or RUN, CONT), away from its "--- FAIL" line: print each failing test's
# blocks, the last 80 lines of them. A test is named with its package's
# place in the log (the count of "ok"/"FAIL<tab>" lines before it), so that
# a same-named test of another package is not mixed in, and a test a
# timeout stopped (listed under "running tests:", no "--- FAIL" line) is
# included. Two passes over the log, whatever the number of failures; the
# names reach awk through the environment, not -v (which would expand
# backslashes in them).
failing=$(grep -vE "$klog" "$log" | awk '
	/^ *--- FAIL: / { print pkg "\t" $3 }
	/^panic: test timed out/ { timedout = 1; next }
	timedout && /^\t\t[^ ]+ \(/ { print pkg "\t" $1; next }
	timedout && !/^\t/ { timedout = 0 }
	/^(ok |FAIL\t)/ { pkg++ }' | awk '!seen[$0]++' | head -20)
if [ -n "$failing" ]; then
	grep -vE "$klog" "$log" | FAILING="$failing" awk '
		BEGIN {
			n = split(ENVIRON["FAILING"], lines, "\n")
			for (i = 1; i <= n; i++) { order[i] = lines[i]; want[lines[i]] = 1 }
		}
		/^=== (RUN|NAME|CONT|PAUSE)/ { cur = $3; next }
		/^ *--- / || /^(PASS|FAIL)$/ { cur = ""; next }
		/^(ok |FAIL\t)/ { cur = ""; pkg++; next }
		cur != "" && ((pkg "\t" cur) in want) {
			k = pkg "\t" cur
			got[k]++
			buf[k, got[k] % 80] = $0
		}
		END {
			for (i = 1; i <= n; i++) {
				k = order[i]
				if (!got[k]) continue
				split(k, parts, "\t")
				print "---- " parts[2] ", its messages under -v:"
				for (j = (got[k] > 80 ? got[k] - 79 : 1); j <= got[k]; j++) print buf[k, j % 80]
			}
		}'
fi
echo "---- failed:"
grep -E '^(FAIL|--- FAIL|ok )' "$log" | grep -E 'FAIL' | head -60
exit "$rc"
