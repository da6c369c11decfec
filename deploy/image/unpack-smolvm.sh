#!/bin/sh
# Unpacks smolvm from the smolmachines wheel into a directory of the runtime image:
#
#   sh deploy/image/unpack-smolvm.sh WHEEL DEST
#
# The wheel's package directory `smol/` holds the full smolvm CLI `smol-vmm` (also the VM boot
# helper), libkrun, libkrunfw, the agent rootfs and the disk templates, the same files
# .ci/install-smolvm.sh points SMOLVM_BIN, SMOLVM_LIB_DIR, SMOLVM_AGENT_ROOTFS_TAR and
# SMOLVM_BOOT_BINARY at. Only those files (and the licences) are copied; the Python SDK is not.
# DEST/VERSION records the wheel's version for the image's entrypoint.
set -eu

[ $# -eq 2 ] || { echo "usage: $0 WHEEL DEST" >&2; exit 2; }
wheel=$1 dest=$2
python=${PYTHON:-python3}
files="smol-vmm libkrun.so libkrunfw.so.5 agent-rootfs.tar.zst overlay-template.ext4.zst storage-template.ext4.zst"

fail() { echo "unpack-smolvm.sh: $*" >&2; exit 1; }

[ -f "$wheel" ] || fail "no wheel at $wheel"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# A wheel is a zip archive; Python's zipfile needs nothing beyond python3.
"$python" -m zipfile -e "$wheel" "$tmp" || fail "cannot extract $wheel"

version="$(sed -n 's/^Version: *//p' "$tmp"/smolmachines-*.dist-info/METADATA 2>/dev/null | head -n 1)"
[ -n "$version" ] || fail "$wheel has no smolmachines-*.dist-info/METADATA with a Version"
for f in $files; do
  [ -f "$tmp/smol/$f" ] || fail "smol/$f is missing from $wheel (smolmachines $version)"
done

umask 022
mkdir -p "$dest"
for f in $files; do
  cp "$tmp/smol/$f" "$dest/$f"
done
# zipfile does not restore modes: the binaries and libraries must be executable, the rest readable
# by everyone (smolvm's per-VM unprivileged uids read the rootfs and the templates).
chmod 0755 "$dest" "$dest/smol-vmm" "$dest/libkrun.so" "$dest/libkrunfw.so.5"
chmod 0644 "$dest/agent-rootfs.tar.zst" "$dest/overlay-template.ext4.zst" "$dest/storage-template.ext4.zst"
if [ -f "$tmp/smol/THIRD_PARTY_NOTICES.md" ]; then
  cp "$tmp/smol/THIRD_PARTY_NOTICES.md" "$dest/"
fi
if [ -d "$tmp/smol/licenses" ]; then
  cp -R "$tmp/smol/licenses" "$dest/licenses"
  chmod -R a+rX "$dest/licenses"
fi
printf '%s\n' "$version" >"$dest/VERSION"
echo "unpack-smolvm.sh: smolvm $version in $dest" >&2
