#!/usr/bin/env bash
# Slow bodies (issue 30): the real smolvm-webhook binary, started as in production (default
# limits), while TRICKLERS clients send a review's body one byte every INTERVAL_MS (reconnecting
# when answered or dropped), is sent reviews at RATE per second over HTTP/2 (as the API server
# calls it) and HTTP/1.1. Printed per run: the reviews' answers by status (200 reviewed, 429
# shed) with p50/p99 latency, and how the trickles were answered (408 stalled, timed out or
# displaced). Before the fix, each trickle held a review slot; now none does. Figures are
# printed, never asserted.
#
# Environment: TRICKLERS (40), INTERVAL_MS (1000), RATE (20), SECONDS_PER_RUN (20),
# MAX_CONCURRENT_REVIEWS (32), MAX_CONCURRENT_BODIES (64), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
TRICKLERS=${TRICKLERS:-40}
INTERVAL_MS=${INTERVAL_MS:-1000}
RATE=${RATE:-20}
SECS=${SECONDS_PER_RUN:-20}

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
for http in 2 1; do
  "$BIN/smolvm-webhook" --without-cluster --tls-mode files \
    --tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key" \
    --listen 127.0.0.1:19446 --ops-address 127.0.0.1:19082 \
    --max-concurrent-reviews "${MAX_CONCURRENT_REVIEWS:-32}" \
    --max-concurrent-bodies "${MAX_CONCURRENT_BODIES:-64}" >"$WORK/webhook.log" 2>&1 &
  PID=$!
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/19446) 2>/dev/null && break; sleep 0.1; done
  "$BIN/webhook-bench-load" trickle --addr 127.0.0.1:19446 --path /validate/smolvms --http "$http" \
    --tricklers "$TRICKLERS" --interval-ms "$INTERVAL_MS" --rate "$RATE" --seconds "$SECS" \
    --ca "$WORK/ca.crt" --body "$WORK/review.json"
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=
done
