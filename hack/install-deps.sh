#!/usr/bin/env bash
# Installs the Debian packages the tests need, if they are missing:
#   sslscan     TLS posture checks in test/posture
#   openssl     openssl s_client, a non-Go client in the dual-certificate tests
#               (sni, example/server, test/fips)
#   prometheus  promtool, which checks and unit-tests the alert rules in
#               deploy/prometheus (make test-alerts)
# Idempotent and quiet when everything is present. Runs as root (CI) or
# through sudo; never reads stdin.
set -euo pipefail

#   sslscan     TLS posture checks in test/posture
#   openssl     openssl s_client, a non-Go client in the dual-certificate tests
#               (sni, example/server, test/fips)
#   prometheus  promtool, which checks and unit-tests the alert rules in
#               deploy/prometheus (make test-alerts)

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

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
