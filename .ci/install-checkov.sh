#!/usr/bin/env bash
# Installs the pinned Checkov (PyPI `checkov`) into a private venv and prints its path as a
# shell `export` line:
#
#   eval "$(bash .ci/install-checkov.sh)"
#
# Idempotent: a venv that already holds the pinned version is reused as it is. Progress goes to
# stderr; stdout carries only the export line.
set -euo pipefail

CHECKOV_VERSION="3.3.30"
CHECKOV_HOME="${CHECKOV_HOME:-$HOME/.cache/smolvm-operator/checkov-${CHECKOV_VERSION}}"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-checkov: %s\n' "$*" >&2; }

venv_py="$CHECKOV_HOME/bin/python"
installed_version() {
  [ -x "$venv_py" ] || return 1
  "$venv_py" - <<'PY' 2>/dev/null
import importlib.metadata as m
print(m.version("checkov"))
PY
}

if [ "$(installed_version || true)" = "$CHECKOV_VERSION" ]; then
  log "checkov==$CHECKOV_VERSION already installed in $CHECKOV_HOME"
else
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "error: $PYTHON not found; Checkov is a Python package and needs python3 with venv"
    exit 1
  fi
  log "creating venv in $CHECKOV_HOME"
  mkdir -p "$(dirname "$CHECKOV_HOME")"
  if ! "$PYTHON" -m venv "$CHECKOV_HOME" >&2; then
    log "error: '$PYTHON -m venv' failed (on Debian: apt-get install python3-venv)"
    exit 1
  fi
  log "installing checkov==$CHECKOV_VERSION"
  "$venv_py" -m pip install --disable-pip-version-check --quiet "checkov==$CHECKOV_VERSION" >&2
  got="$(installed_version || true)"
  if [ "$got" != "$CHECKOV_VERSION" ]; then
    log "error: expected checkov $CHECKOV_VERSION in the venv, found '${got:-nothing}'"
    exit 1
  fi
fi

q() { printf '%q' "$1"; }
echo "export SMOLVM_CHECKOV=$(q "$CHECKOV_HOME/bin/checkov")"
