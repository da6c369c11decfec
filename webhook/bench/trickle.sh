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

TRICKLERS=${TRICKLERS:-40}
INTERVAL_MS=${INTERVAL_MS:-1000}
RATE=${RATE:-20}
SECS=${SECONDS_PER_RUN:-20}

# shellcheck source=webhook/bench/lib.sh
source "$(dirname "$0")/lib.sh"

for http in 2 1; do
  start_webhook 19446 19082 --max-concurrent-reviews "${MAX_CONCURRENT_REVIEWS:-32}" \
    --max-concurrent-bodies "${MAX_CONCURRENT_BODIES:-64}"
  "$BIN/webhook-bench-load" trickle --addr 127.0.0.1:19446 --path /validate/smolvms --http "$http" \
    --tricklers "$TRICKLERS" --interval-ms "$INTERVAL_MS" --rate "$RATE" --seconds "$SECS" \
    --ca "$WORK/ca.crt" --body "$WORK/review.json"
  stop_webhook
done
