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

CLIENTS=${CLIENTS:-128}
SECS=${SECONDS_PER_RUN:-10}
BODY_BYTES=${BODY_BYTES:-1048000}

# shellcheck source=webhook/bench/lib.sh
source "$(dirname "$0")/lib.sh"

for http in 1 2; do
  for shape in string objects; do
    start_webhook 19445 19081
    "$BIN/webhook-bench-load" flood --addr 127.0.0.1:19445 --path /mutate/smolvms --http "$http" \
      --clients "$CLIENTS" --seconds "$SECS" --body-bytes "$BODY_BYTES" --shape "$shape" \
      --pid "$PID" --ca "$WORK/ca.crt"
    shed=$(curl -s http://127.0.0.1:19081/metrics | grep '^smolvm_webhook_shed_requests_total' || true)
    echo "   metrics: ${shed:-no request shed}"
    stop_webhook
  done
done
