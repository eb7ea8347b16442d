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
# blocks, the last 80 lines of them.
for name in $(grep -oE '^ *--- FAIL: [^ ]+' "$log" | awk '{print $3}' | sort -u | head -20); do
	blocks=$(grep -vE "$klog" "$log" | awk -v want="$name" '
		/^=== (RUN|NAME|CONT|PAUSE)/ { cur = $3; next }
		/^(--- |PASS$|FAIL$|ok |FAIL\t)/ { cur = ""; next }
		cur == want { print }' | tail -80)
	if [ -n "$blocks" ]; then
		echo "---- $name, its messages under -v:"
		echo "$blocks"
	fi
done
echo "---- failed:"
grep -E '^(FAIL|--- FAIL|ok )' "$log" | grep -E 'FAIL' | head -60
exit "$rc"
