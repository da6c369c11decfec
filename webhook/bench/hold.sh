#!/usr/bin/env bash
# Memory under held HTTP/2 streams (issue 56): the real smolvm-webhook binary, started as in
# production (default limits), is sent CONNECTIONS HTTP/2 connections from SOURCES loopback
# addresses (127.0.0.2 on; the webhook bounds connections per source address), each sending
# BODY_BYTES of DATA on a stream it never ends (a new stream when the server answers the last),
# for SECONDS_PER_RUN. What the webhook buffers for those streams is bounded by its HTTP/2
# windows (--http2-buffer-budget over --max-connections) and its reader slots
# (--max-concurrent-bodies x --body-limit). Printed: connections served and refused, the streams'
# answers by status (408 stalled, 429 no reader slot), and the server's resident memory (sampled
# peak and the kernel's high-water mark) against the pod's 256 MiB limit. Figures are printed,
# never asserted.
#
# Environment: CONNECTIONS (1024), SOURCES (16), STREAMS (1 per connection), BODY_BYTES (1048576),
# SECONDS_PER_RUN (20), WEBHOOK_FLAGS (extra flags for smolvm-webhook), CARGO_TARGET_DIR.
set -euo pipefail

CONNECTIONS=${CONNECTIONS:-1024}
SOURCES=${SOURCES:-16}
STREAMS=${STREAMS:-1}
BODY_BYTES=${BODY_BYTES:-1048576}
SECS=${SECONDS_PER_RUN:-20}

# shellcheck source=webhook/bench/lib.sh
source "$(dirname "$0")/lib.sh"

# shellcheck disable=SC2086 # WEBHOOK_FLAGS is a list of flags
start_webhook 19447 19083 ${WEBHOOK_FLAGS:-}
"$BIN/webhook-bench-load" hold --addr 127.0.0.1:19447 --connections "$CONNECTIONS" --sources "$SOURCES" --streams "$STREAMS" \
  --body-bytes "$BODY_BYTES" --seconds "$SECS" --pid "$PID" --ca "$WORK/ca.crt"
closed=$(curl -s http://127.0.0.1:19083/metrics | grep '^smolvm_webhook_connections_closed_total' | tr '\n' ' ' || true)
echo "   metrics: ${closed:-no connection closed by a bound}"
