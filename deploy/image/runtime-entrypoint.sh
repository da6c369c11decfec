#!/bin/sh
# Entrypoint of the runtime image: gives smolvm a library directory on the node, then runs
# smolvm-runtime with the container's arguments.
#
# Why not run smolvm from the image directly: on the first machine it creates, smolvm unpacks its
# disk templates (overlay-template.ext4, storage-template.ext4, sparse) next to the .zst files in
# SMOLVM_LIB_DIR, and every machine's qcow2 disks then name those templates as backing files by
# absolute path. So the library directory must be writable and must outlive the container: it is
# <state dir>/lib/smolvm-<version> on the node's /var/lib/smolvm hostPath, filled once per smolvm
# version from the image's copy (/opt/smolvm) and never changed afterwards. An upgrade to a new
# smolvm version gets a new directory; the old one stays for the machines created with it.
#
# Exports the variables .ci/install-smolvm.sh exports for the same files: SMOLVM_BIN,
# SMOLVM_LIB_DIR, SMOLVM_AGENT_ROOTFS_TAR and SMOLVM_BOOT_BINARY.
#
# Settings (environment): SMOLVM_RUNTIME_STATE_DIR (also read by smolvm-runtime; default
# /var/lib/smolvm), SMOLVM_DIST (default /opt/smolvm), SMOLVM_RUNTIME_BIN (default
# /usr/local/bin/smolvm-runtime).
set -eu

dist="${SMOLVM_DIST:-/opt/smolvm}"
state_dir="${SMOLVM_RUNTIME_STATE_DIR:-/var/lib/smolvm}"
runtime_bin="${SMOLVM_RUNTIME_BIN:-/usr/local/bin/smolvm-runtime}"
files="smol-vmm libkrun.so libkrunfw.so.5 agent-rootfs.tar.zst overlay-template.ext4.zst storage-template.ext4.zst"

fail() {
  echo "runtime-entrypoint: $*" >&2
  exit 1
}

[ -r "$dist/VERSION" ] || fail "$dist/VERSION is missing: the image has no unpacked smolvm"
version="$(head -n 1 "$dist/VERSION")"
case "$version" in
  "" | *[!A-Za-z0-9.+-]*) fail "$dist/VERSION holds an unusable version '$version'" ;;
esac
lib_dir="$state_dir/lib/smolvm-$version"

# smolvm's per-VM uids must be able to read the library directory and the templates.
umask 022
if [ ! -f "$lib_dir/.complete" ]; then
  for f in $files; do
    [ -f "$dist/$f" ] || fail "$dist/$f is missing from the image"
  done
  mkdir -p "$state_dir/lib"
  # Fill a fresh directory, then rename it into place: an interrupted copy never looks complete.
  # A directory without the marker was never handed to smolvm, so it is safe to replace.
  # One agent per node: leftovers of an interrupted earlier start can go.
  rm -rf "$lib_dir".partial.*
  tmp="$(mktemp -d "$lib_dir.partial.XXXXXX")"
  chmod 0755 "$tmp"
  for f in $files; do
    cp "$dist/$f" "$tmp/$f"
  done
  chmod 0755 "$tmp/smol-vmm" "$tmp/libkrun.so" "$tmp/libkrunfw.so.5"
  : >"$tmp/.complete"
  rm -rf "$lib_dir"
  mv "$tmp" "$lib_dir"
  echo "runtime-entrypoint: smolvm $version prepared in $lib_dir" >&2
fi

SMOLVM_LIB_DIR="$lib_dir"
SMOLVM_BIN="$lib_dir/smol-vmm"
SMOLVM_BOOT_BINARY="$lib_dir/smol-vmm"
SMOLVM_AGENT_ROOTFS_TAR="$lib_dir/agent-rootfs.tar.zst"
export SMOLVM_LIB_DIR SMOLVM_BIN SMOLVM_BOOT_BINARY SMOLVM_AGENT_ROOTFS_TAR
exec "$runtime_bin" "$@"
