#!/usr/bin/env bash
# Static checks: gofmt, go vet and staticcheck (pinned, installed into ./bin),
# in the main module and in the nested modules (listed below).
set -euo pipefail
cd "$(dirname "$0")/.."

STATICCHECK_VERSION=v0.8.2 # honnef.co/go/tools release that supports Go 1.26
BIN="$PWD/bin"
mkdir -p "$BIN"
if ! "$BIN/staticcheck" -version 2>/dev/null | grep -q "${STATICCHECK_VERSION#v}"; then
  GOBIN="$BIN" go install "honnef.co/go/tools/cmd/staticcheck@${STATICCHECK_VERSION}"
fi

echo "gofmt"
unformatted=$(gofmt -l $(git ls-files --cached --others --exclude-standard '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
echo "go vet"
go vet -tags e2e,soak,fips ./...
echo "staticcheck"
"$BIN/staticcheck" -tags e2e,soak,fips ./...
# Nested modules with Go code of their own (gofmt above covers their files).
# The e2e tag covers controllerruntime/e2e (the sample operator's e2e).
# pkcs11 uses cgo (PKCS#11): vet and staticcheck need CGO_ENABLED=1 there.
for mod in test/controllerruntime test/grpc controllerruntime controllerruntime/example/certcontroller test/deploy test/migrate pkcs11; do
  echo "go vet ($mod)"
  (cd "$mod" && CGO_ENABLED=1 go vet -tags e2e ./...)
  echo "staticcheck ($mod)"
  (cd "$mod" && CGO_ENABLED=1 "$BIN/staticcheck" -tags e2e ./...)
done
