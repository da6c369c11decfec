#!/usr/bin/env bash
# Installs the pinned smolvm (PyPI package `smolmachines`) into a private venv and
# prints the environment the runtime and its tests need, as shell `export` lines:
#
#   eval "$(bash .ci/install-smolvm.sh)"
#
# Idempotent: a venv that already holds the pinned version is reused as it is.
# Progress goes to stderr; stdout carries only the export lines.
set -euo pipefail

SMOLVM_VERSION="1.32.2"
SMOLVM_HOME="${SMOLVM_HOME:-$HOME/.cache/smolvm-operator/smolvm-${SMOLVM_VERSION}}"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-smolvm: %s\n' "$*" >&2; }

venv_py="$SMOLVM_HOME/bin/python"

installed_version() {
  [ -x "$venv_py" ] || return 1
  "$venv_py" - <<'PY' 2>/dev/null
import importlib.metadata as m
print(m.version("smolmachines"))
PY
}

if [ "$(installed_version || true)" = "$SMOLVM_VERSION" ]; then
  log "smolmachines==$SMOLVM_VERSION already installed in $SMOLVM_HOME"
else
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "error: $PYTHON not found; smolvm ships as a Python wheel and needs python3 with venv"
    exit 1
  fi
  log "creating venv in $SMOLVM_HOME"
  mkdir -p "$(dirname "$SMOLVM_HOME")"
  if ! "$PYTHON" -m venv "$SMOLVM_HOME" >&2; then
    log "error: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 1
  fi
  log "installing smolmachines==$SMOLVM_VERSION"
  "$venv_py" -m pip install --disable-pip-version-check --quiet "smolmachines==$SMOLVM_VERSION" >&2
  got="$(installed_version || true)"
  if [ "$got" != "$SMOLVM_VERSION" ]; then
    log "error: expected smolmachines $SMOLVM_VERSION in the venv, found '${got:-nothing}'"
    exit 1
  fi
fi

# Locate the package directory without importing it (importing loads the native extension).
pkg_dir="$("$venv_py" - <<'PY'
import importlib.metadata as m
print(m.distribution("smolmachines").locate_file("smol"))
PY
)"

bin="$pkg_dir/smol-vmm"
for f in "$bin" "$pkg_dir/libkrun.so" "$pkg_dir/libkrunfw.so.5" "$pkg_dir/agent-rootfs.tar.zst"; do
  if [ ! -e "$f" ]; then
    log "error: $f is missing from smolmachines $SMOLVM_VERSION"
    exit 1
  fi
done
if [ ! -x "$bin" ]; then
  chmod +x "$bin"
fi

# `smol-vmm` is the full smolvm CLI (it prints a harmless note about packed assets on
# stderr). The same binary is the VM boot helper (`smol-vmm _boot-vm <config>`), so
# SMOLVM_BOOT_BINARY points at it too.
log "smolvm at $bin ($("$bin" --version 2>/dev/null || echo 'version unknown'))"

q() { printf '%q' "$1"; }
echo "export SMOLVM_HOME=$(q "$SMOLVM_HOME")"
echo "export SMOLVM_BIN=$(q "$bin")"
echo "export SMOLVM_LIB_DIR=$(q "$pkg_dir")"
echo "export SMOLVM_AGENT_ROOTFS_TAR=$(q "$pkg_dir/agent-rootfs.tar.zst")"
echo "export SMOLVM_BOOT_BINARY=$(q "$bin")"
