#!/usr/bin/env bash
# `make run`: the controller and the webhook, built in debug mode, run on this machine against the
# cluster of $KUBECONFIG (or ~/.kube/config), until Ctrl-C.
#
# - The controller joins leader election on the Lease smolvm-system/smolvm-controller as
#   "local-<hostname>": with an in-cluster controller running, the local one waits as standby
#   (scale the in-cluster Deployment to 0 to hand over). It creates the runtime CA and the node
#   API token Secret in smolvm-system if absent, like the in-cluster one. Ops: 127.0.0.1:8080.
# - The webhook runs in files TLS mode with a throwaway self-signed certificate for localhost and
#   127.0.0.1 (made with openssl under the target directory), on 127.0.0.1:9443 (ops on
#   127.0.0.1:8081). It does not touch the cluster's webhook configurations: the API server
#   keeps calling the in-cluster webhook, if any, and never this one. Use it with curl or the
#   webhook's benchmarks (webhook/bench/run.sh).
#
# Needs: the CRDs (make install) and the namespace smolvm-system. Settings: CARGO_TARGET_DIR,
# SMOLVM_NAMESPACE (default smolvm-system), RUST_LOG.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

target_dir="${CARGO_TARGET_DIR:-target}"
bin_dir="$target_dir/debug"
namespace="${SMOLVM_NAMESPACE:-smolvm-system}"
policy="deploy/base/policy/policy.yaml"
work="$target_dir/run-local"

for b in smolvm-controller smolvm-webhook; do
  [ -x "$bin_dir/$b" ] || { echo "run-local: $bin_dir/$b is missing; run: cargo build --bin $b" >&2; exit 1; }
done
if command -v kubectl >/dev/null 2>&1 && ! kubectl get namespace "$namespace" >/dev/null 2>&1; then
  echo "run-local: namespace $namespace not found in the current cluster (or the cluster is unreachable)." >&2
  echo "  create it: kubectl create namespace $namespace; and the CRDs: make install" >&2
  exit 1
fi

mkdir -p "$work"
cert="$work/webhook.crt" key="$work/webhook.key"
if [ ! -s "$cert" ] || ! openssl x509 -in "$cert" -noout -checkend 86400 >/dev/null 2>&1; then
  command -v openssl >/dev/null 2>&1 || { echo "run-local: openssl is needed for the webhook's local certificate" >&2; exit 1; }
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 \
    -subj "/CN=localhost" -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    -keyout "$key" -out "$cert" 2>/dev/null
  chmod 0600 "$key"
  echo "run-local: webhook certificate $cert (valid 30 days; trust it with curl --cacert)" >&2
fi

export RUST_LOG="${RUST_LOG:-info}"
export POD_NAMESPACE="$namespace"

"$bin_dir/smolvm-webhook" --tls-mode files --tls-cert "$cert" --tls-key "$key" \
  --listen 127.0.0.1:9443 --ops-address 127.0.0.1:8081 --policy "$policy" &
webhook_pid=$!
trap 'kill "$webhook_pid" 2>/dev/null || true; wait "$webhook_pid" 2>/dev/null || true' EXIT

POD_NAME="local-$(hostname)" "$bin_dir/smolvm-controller" \
  --policy "$policy" --ops-address 127.0.0.1:8080
