#!/usr/bin/env bash
# Memory under flood (issue 12): the real smolvm-webhook binary, started as in production
# (default --body-limit and --max-concurrent-reviews), is sent maximum-size reviews by CLIENTS
# clients at once, each on its own connection, back to back, over HTTP/1.1 and HTTP/2, with two
# body shapes: a padded annotation string and managedFields made of many small JSON objects (the
# most memory per byte). Printed per run: answers by status (200 or 403 reviewed, 429 shed with
# Retry-After), transport errors, and the server's resident memory (sampled peak and the
# kernel's high-water mark) against the pod's 256 MiB limit. Figures are printed, never asserted.
#
# Environment: CLIENTS (128), SECONDS_PER_RUN (10), BODY_BYTES (1048000), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
CLIENTS=${CLIENTS:-128}
SECS=${SECONDS_PER_RUN:-10}
BODY_BYTES=${BODY_BYTES:-1048000}

(cd "$ROOT" && cargo build --release -p smolvm-webhook --features bench --bins)
BIN=$TARGET/release
WORK=$(mktemp -d)
PID=
cleanup() {
  [[ -n "$PID" ]] && kill "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/webhook-bench-load" gen "$WORK" >/dev/null
for http in 1 2; do
  for shape in string objects; do
    "$BIN/smolvm-webhook" --without-cluster --tls-mode files \
      --tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key" \
      --listen 127.0.0.1:19445 --ops-address 127.0.0.1:19081 >"$WORK/webhook.log" 2>&1 &
    PID=$!
    for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/19445) 2>/dev/null && break; sleep 0.1; done
    "$BIN/webhook-bench-load" flood --addr 127.0.0.1:19445 --path /mutate/smolvms --http "$http" \
      --clients "$CLIENTS" --seconds "$SECS" --body-bytes "$BODY_BYTES" --shape "$shape" \
      --pid "$PID" --ca "$WORK/ca.crt"
    shed=$(curl -s http://127.0.0.1:19081/metrics | grep '^smolvm_webhook_shed_requests_total' || true)
    echo "   metrics: ${shed:-no request shed}"
    kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  done
done
