#!/usr/bin/env bash
# Finds or fetches kube-apiserver and etcd for the e2e tests and `make dev`, the way
# controller-runtime's setup-envtest does, and prints `export KUBEBUILDER_ASSETS=…` on stdout.
#
#   eval "$(bash tests/scripts/envtest.sh)"
#
# Order: an existing KUBEBUILDER_ASSETS (or TEST_ASSET_KUBE_APISERVER) is kept; then
# kube-apiserver on PATH; then the cache; then a download of the pinned envtest release
# (sha512-checked against the pin below, from controller-tools' envtest release index). Where
# nothing can be downloaded it says so on stderr, prints nothing on stdout, and exits 0: the
# e2e tests then print "skipped: no kube-apiserver (set KUBEBUILDER_ASSETS)".
set -euo pipefail

ENVTEST_VERSION="1.35.0"
# sha512 of envtest-v1.35.0-<os>-<arch>.tar.gz (controller-tools envtest-releases.yaml).
declare -A SHA512=(
  [linux-amd64]=130369c16f076e724d089189afaede960316f5f5dea6cf57be7a4fc6f09c77342893192509790e4056e116e232dff832ed863f5bd55dcb55d38f3ab834828a11
)
RELEASES="https://github.com/kubernetes-sigs/controller-tools/releases/download"
CACHE="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/smolvm-operator/envtest}"

log() { printf 'envtest: %s\n' "$*" >&2; }
how_to() {
  log "point KUBEBUILDER_ASSETS at a directory holding kube-apiserver and etcd (for example"
  log "one setup-envtest made), or set TEST_ASSET_KUBE_APISERVER and TEST_ASSET_ETCD; Debian's"
  log "etcd-server package gives etcd."
}

if [ -n "${KUBEBUILDER_ASSETS:-}" ] || [ -n "${TEST_ASSET_KUBE_APISERVER:-}" ]; then
  log "using the binaries already configured"
  [ -n "${KUBEBUILDER_ASSETS:-}" ] && printf 'export KUBEBUILDER_ASSETS=%q\n' "$KUBEBUILDER_ASSETS"
  exit 0
fi
if command -v kube-apiserver >/dev/null 2>&1; then
  log "using kube-apiserver from PATH ($(command -v kube-apiserver))"
  exit 0
fi

os=$(uname -s | tr '[:upper:]' '[:lower:]')
case "$(uname -m)" in
  x86_64 | amd64) arch=amd64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac
platform="$os-$arch"
dir="$CACHE/$ENVTEST_VERSION-$platform"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  log "using the cached envtest $ENVTEST_VERSION in $dir"
  printf 'export KUBEBUILDER_ASSETS=%q\n' "$dir"
  exit 0
fi

want=${SHA512[$platform]:-}
if [ -z "$want" ]; then
  log "no pinned checksum for $platform (pinned: ${!SHA512[*]}); not downloading anything"
  how_to
  exit 0
fi
archive="envtest-v$ENVTEST_VERSION-$platform.tar.gz"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading $archive"
if ! curl -fsSL --retry 2 --connect-timeout 10 -o "$tmp/$archive" "$RELEASES/envtest-v$ENVTEST_VERSION/$archive"; then
  log "download failed (no network?); nothing was installed"
  how_to
  exit 0
fi
got=$(sha512sum "$tmp/$archive" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  log "checksum mismatch for $archive: got $got, want $want; nothing was installed"
  exit 1
fi
mkdir -p "$tmp/x"
tar -xzf "$tmp/$archive" -C "$tmp/x"
apiserver=$(find "$tmp/x" -type f -name kube-apiserver | head -n1)
if [ -z "$apiserver" ]; then
  log "$archive holds no kube-apiserver"
  exit 1
fi
mkdir -p "$dir"
cp "$(dirname "$apiserver")"/* "$dir/"
chmod +x "$dir"/*
log "installed envtest $ENVTEST_VERSION into $dir"
printf 'export KUBEBUILDER_ASSETS=%q\n' "$dir"
