#!/usr/bin/env bash
# install-kube.sh builds the control-plane binaries used by the e2e tests
# (internal/testcluster) from source, through the Go module proxy:
#
#   hack/tools/bin/kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver
#   hack/tools/bin/etcd             go.etcd.io/etcd/server/v3
#
# The versions are pinned by hack/tools/go.mod (+ go.sum); this script reads
# them from there, so bumping a version is a `go get` in hack/tools only.
#
# Idempotent: a binary is rebuilt only when it is missing or its --version
# output does not match the pinned version. Pass --force to rebuild anyway.
#
# Resource use: a cold build downloads the modules and compiles ~2,100
# packages for kube-apiserver and ~570 for etcd: about 10 minutes on 2 cores;
# the peak resident memory (linking kube-apiserver) is about 2.5 GB. The two
# binaries are built one after the other, each with
# -p "${KUBE_BUILD_PARALLELISM}" (default: number of CPUs, at most 4).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${ROOT}/hack/tools"
BIN="${TOOLS}/bin"

force=0
for arg in "$@"; do
	case "${arg}" in
	--force) force=1 ;;
	-h | --help)
		sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "install-kube.sh: unknown argument: ${arg}" >&2
		exit 2
		;;
	esac
done

command -v go >/dev/null 2>&1 || {
	echo "install-kube.sh: go is not on PATH" >&2
	exit 1
}

# Build exactly what hack/tools/go.mod + go.sum pin; ignore any go.work and
# never rewrite go.mod/go.sum behind the committer's back.
export GOWORK=off
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
# Upstream ships both binaries statically linked; this also avoids needing a
# C toolchain.
export CGO_ENABLED=0

ncpu="$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)"
if [ "${ncpu}" -gt 4 ]; then ncpu=4; fi
PAR="${KUBE_BUILD_PARALLELISM:-${ncpu}}"

modversion() { (cd "${TOOLS}" && go list -m -f '{{.Version}}' "$1"); }

KUBE_VERSION="$(modversion k8s.io/kubernetes)"       # e.g. v1.37.1
ETCD_VERSION="$(modversion go.etcd.io/etcd/api/v3)"  # etcd's version constant lives in api/v3
kube_minor="$(echo "${KUBE_VERSION}" | cut -d. -f2)"
kube_major="$(echo "${KUBE_VERSION#v}" | cut -d. -f1)"

# Expected `--version` output (first line).
want_kube="Kubernetes ${KUBE_VERSION}"
want_etcd="etcd Version: ${ETCD_VERSION#v}"

have_version() { # <binary> <expected first line of --version>
	[ -x "$1" ] || return 1
	local out
	# Capture everything first: piping into `head` could SIGPIPE the binary
	# and, with pipefail, turn a match into a spurious mismatch.
	out="$("$1" --version 2>/dev/null)" || return 1
	[ "${out%%$'\n'*}" = "$2" ]
}

build() { # <name> <package> <ldflags>
	local name="$1" pkg="$2" ldflags="$3" start end
	start="$(date +%s)"
	echo "install-kube.sh: building ${name} from ${pkg} (-p ${PAR}) ..."
	# Build to a temporary name and rename, so an interrupted build never
	# leaves a truncated binary that looks installed.
	(cd "${TOOLS}" && go build -p "${PAR}" -trimpath -ldflags "${ldflags}" \
		-o "${BIN}/.${name}.tmp" "${pkg}")
	mv -f "${BIN}/.${name}.tmp" "${BIN}/${name}"
	end="$(date +%s)"
	echo "install-kube.sh: built ${name} in $((end - start))s"
}

mkdir -p "${BIN}"
# Leftovers of an interrupted build.
trap 'rm -f "${BIN}/.etcd.tmp" "${BIN}/.kube-apiserver.tmp"' EXIT

if [ "${force}" = 1 ] || ! have_version "${BIN}/etcd" "${want_etcd}"; then
	build etcd go.etcd.io/etcd/server/v3 "-s -w"
else
	echo "install-kube.sh: etcd ${ETCD_VERSION} already built"
fi

if [ "${force}" = 1 ] || ! have_version "${BIN}/kube-apiserver" "${want_kube}"; then
	vpkg=k8s.io/component-base/version
	build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
		"-s -w -X ${vpkg}.gitVersion=${KUBE_VERSION} -X ${vpkg}.gitMajor=${kube_major} -X ${vpkg}.gitMinor=${kube_minor} -X ${vpkg}.gitTreeState=clean"
else
	echo "install-kube.sh: kube-apiserver ${KUBE_VERSION} already built"
fi

# Verify what we built actually reports the pinned versions.
have_version "${BIN}/etcd" "${want_etcd}" || {
	echo "install-kube.sh: ${BIN}/etcd does not report '${want_etcd}'" >&2
	exit 1
}
have_version "${BIN}/kube-apiserver" "${want_kube}" || {
	echo "install-kube.sh: ${BIN}/kube-apiserver does not report '${want_kube}'" >&2
	exit 1
}

echo "${BIN}/kube-apiserver (${KUBE_VERSION})"
echo "${BIN}/etcd (${ETCD_VERSION})"
