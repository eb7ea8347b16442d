#!/usr/bin/env bash
# Installs the Debian packages the tests need, if they are missing, and checks
# that each one put its program on PATH:
#
#   package     program   used by
#   sslscan     sslscan   TLS posture checks in test/posture and test/fips
#   openssl     openssl   openssl s_client, a non-Go client in the
#                         dual-certificate tests (sni, example/server, test/fips)
#   prometheus  promtool  checks and unit-tests the alert rules in
#                         deploy/prometheus (make test-alerts)
#   procps      pgrep     internal/testcluster's check that no control-plane
#                         process outlives its test
#   softhsm2    softhsm2-util  a PKCS#11 token for the CA keys of the
#                         pkcs11 module's tests (make test-hsm), and its
#                         library /usr/lib/softhsm/libsofthsm2.so
#
# kube-apiserver and etcd are not packages: hack/install-kube.sh builds them.
# hack/deps_test.go keeps this table and the programs the tests run in step.
#
# Idempotent and quiet when everything is present. Runs as root (CI) or
# through sudo; never reads stdin. Exits non-zero if a package cannot be
# installed or a program is still missing afterwards.
#
# hack/deps_test.go runs this script with fake apt-get and dpkg-query first
# on PATH to check what a fresh machine would get.
set -euo pipefail

# "package:program" pairs; keep in step with the table above.
deps=(sslscan:sslscan openssl:openssl prometheus:promtool procps:pgrep softhsm2:softhsm2-util)

if [ "${#deps[@]}" -eq 0 ]; then
  # A merge once emptied this list and the script went on to install
  # nothing and exit 0; never again.
  echo "install-deps: the package list is empty" >&2
  exit 1
fi

missing=()
for dep in "${deps[@]}"; do
  pkg="${dep%%:*}"
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      SUDO=(sudo -n)
    else
      echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
      exit 1
    fi
  fi

  export DEBIAN_FRONTEND=noninteractive
  apt_install() {
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
  }
  echo "install-deps: installing ${missing[*]}" >&2
  # Refresh the package lists only when the install cannot find a package
  # (fresh container, stale or empty lists).
  if ! apt_install 2>/dev/null; then
    "${SUDO[@]}" apt-get update -qq </dev/null >/dev/null
    apt_install
  fi
fi

# A package can be installed and still not provide the program (renamed,
# split, or a diverted PATH): say so here rather than in a test later.
absent=()
for dep in "${deps[@]}"; do
  prog="${dep#*:}"
  command -v "$prog" >/dev/null 2>&1 || absent+=("$prog (package ${dep%%:*})")
done
if [ "${#absent[@]}" -gt 0 ]; then
  echo "install-deps: still not on PATH after install: ${absent[*]}" >&2
  exit 1
fi
