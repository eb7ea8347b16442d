#!/usr/bin/env bash
# Runs every fuzz target of the module, one at a time, each for FUZZTIME
# (default 5m), and prints a summary of executions per target.
#
#   hack/fuzz.sh                       # every target, 5m each
#   FUZZTIME=30s hack/fuzz.sh          # shorter
#   hack/fuzz.sh FuzzSecretData        # only the named targets
#
# The seed corpora also run in plain `go test` (make test-unit), so this
# script is only for the long, coverage-guided runs. A failing input is
# written by `go test` to <pkg>/testdata/fuzz/<Target>/ and becomes a
# regression seed once committed.
#
# Environment:
#   FUZZTIME          -fuzztime per target (default 5m; "1000x" counts runs)
#   FUZZMINIMIZETIME  -fuzzminimizetime for every target (default: per target,
#                     see below). Each input that finds new coverage is
#                     minimized first; with the default 60s a slow target
#                     spends nearly all its time minimizing.
#   FUZZTIMEOUT       go test -timeout per target (default 2h)
#   FUZZLOGDIR        where full logs go (default: a new temporary directory)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-5m}"
FUZZTIMEOUT="${FUZZTIMEOUT:-2h}"
FUZZLOGDIR="${FUZZLOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/evercert-fuzz.XXXXXX")}"
mkdir -p "$FUZZLOGDIR"

# target package default-minimize-time
targets=(
  "FuzzParseCertKey    ./internal/pki/  10s"
  "FuzzParseCABundle   ./internal/pki/  10s"
  "FuzzSplitCertKey    ./internal/pki/  10s"
  "FuzzSNICertKeyFlag  ./server/        10s"
  "FuzzSecretData      ./dynamiccert/   200x"
)

want=("$@")
selected() {
  [ "${#want[@]}" -eq 0 ] && return 0
  local w
  for w in "${want[@]}"; do [ "$w" = "$1" ] && return 0; done
  return 1
}
for w in "${want[@]}"; do
  if ! printf '%s\n' "${targets[@]}" | awk '{print $1}' | grep -qx -- "$w"; then
    echo "fuzz.sh: unknown target $w" >&2
    exit 2
  fi
done

summary=()
failed=0
for t in "${targets[@]}"; do
  read -r name pkg minimize <<<"$t"
  selected "$name" || continue
  minimize="${FUZZMINIMIZETIME:-$minimize}"
  log="$FUZZLOGDIR/$name.log"
  echo "==> $name ($pkg) for $FUZZTIME, minimize $minimize; log $log"
  start=$(date +%s)
  rc=0
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" -fuzzminimizetime "$minimize" \
    -timeout "$FUZZTIMEOUT" "$pkg" >"$log" 2>&1 || rc=$?
  secs=$(( $(date +%s) - start ))
  # The last progress line holds the totals, e.g.
  # "fuzz: elapsed: 5m0s, execs: 1234567 (4115/sec), new interesting: 12 (total: 52)".
  last=$(grep -E '^fuzz: elapsed: .*execs: ' "$log" | tail -n 1 || true)
  execs=$(sed -nE 's/.*execs: ([0-9]+).*/\1/p' <<<"$last")
  interesting=$(sed -nE 's/.*new interesting: ([0-9]+) \(total: ([0-9]+)\).*/\1 new, \2 total/p' <<<"$last")
  if [ "$rc" -eq 0 ]; then
    result=PASS
  else
    result="FAIL (exit $rc)"
    failed=1
    echo "--- $name failed; end of its log:"
    tail -n 40 "$log"
  fi
  line=$(printf '%-20s %-15s %8ss wall  execs %-12s corpus %-22s %s' \
    "$name" "$pkg" "$secs" "${execs:-?}" "${interesting:-?}" "$result")
  echo "$line"
  summary+=("$line")
done

echo
echo "fuzz summary (FUZZTIME=$FUZZTIME, logs in $FUZZLOGDIR):"
printf '%s\n' "${summary[@]}"
exit "$failed"
