#!/bin/bash
# Installs the Debian packages the test bed and the cgo build need, if any is
# missing, and makes sure apt's package lists exist (prepare.sh asks apt which
# kernel linux-image-amd64 depends on). Safe to run every time: a ready host
# costs one dpkg-query. Arguments name more packages (make bench's perf).
set -euo pipefail
pkgs="qemu-system-x86 busybox-static kmod cpio xz-utils zstd gcc libc6-dev make util-linux
	rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest librdmacm-dev libibverbs-dev iproute2 $*"
missing=
for p in $pkgs; do
	[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] || missing="$missing $p"
done
sudo=
[ "$(id -u)" = 0 ] || sudo=sudo
# Lists are fresh when they name a kernel and were fetched within a day:
# the security archive keeps only its newest kernel, so a candidate taken
# from old lists may no longer download (a cold test bed cache needs it).
lists_ok() {
	local policy
	policy=$(apt-cache policy linux-image-amd64 2>/dev/null || true)
	[[ $policy == *"Candidate: "[0-9]* ]] &&
		[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*Release' -mmin -1440 2>/dev/null | head -n1)" ]
}
if [ -n "${missing// /}" ] || ! lists_ok; then
	echo "deps: apt-get update" >&2
	$sudo apt-get update -q >&2
fi
if [ -n "${missing// /}" ]; then
	echo "deps: installing $missing" >&2
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing >&2
fi
command -v go >/dev/null || { echo "deps: Go is not installed (need Go 1.21 or later; it fetches the toolchain go.mod names)" >&2; exit 1; }
