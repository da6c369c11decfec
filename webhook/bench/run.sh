#!/usr/bin/env bash
# Loopback TLS benchmark of smolvm-webhook (SPEC section 9): the server pinned to one core, the
# load on another, TLS 1.3, keep-alive, 16 connections, a ~1.8 KB AdmissionReview.
#
# Compared in the same run with
#   (a) webhook-bench-floor: axum + axum-server + rustls that only parses the JSON and echoes
#       the uid (same TLS config);
#   (b) kube-rs's example admission controller, if KUBE_EXAMPLE_BIN points at a binary you built
#       yourself from kube-rs's examples/admission_controller.rs (this script never fetches or
#       builds third-party code). It is started with ADMISSION_PRIVATE_IP=127.0.0.1 in a
#       directory holding admission-controller-tls.{crt,key}, logging at info to /dev/null.
#
# Load: webhook-bench-load (Rust, verifies the certificate) for HTTP/1.1 and HTTP/2, maximum
# throughput and fixed offered rates with p50/p99/p99.9 (open loop, latency from each request's
# due time); plus, when installed (Debian packages wrk and nghttp2-client), wrk (HTTP/1.1) and
# h2load (HTTP/2) maximum throughput and h2load fixed-rate latency over both protocols as a
# second opinion. wrk and h2load do not verify the certificate (they cannot be given a CA).
# Figures are printed, never asserted.
#
# Environment: SERVER_CPU (0), LOAD_CPU (1), SECONDS_PER_RUN (10), RATES ("2000 5000"),
# CONNECTIONS (16), KUBE_EXAMPLE_BIN (unset), CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
SECS=${SECONDS_PER_RUN:-10}
RATES=${RATES:-"2000 5000"}
CONNS=${CONNECTIONS:-16}

(cd "$ROOT" && cargo build --release -p smolvm-webhook --features bench --bins)
BIN=$TARGET/release
WORK=$(mktemp -d)
PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/webhook-bench-load" gen "$WORK"

taskset -c "$SERVER_CPU" "$BIN/smolvm-webhook" --without-cluster --tls-mode files \
  --tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key" \
  --listen 127.0.0.1:19443 --ops-address 127.0.0.1:19080 --workers 1 >"$WORK/webhook.log" 2>&1 &
PIDS+=($!)
taskset -c "$SERVER_CPU" "$BIN/webhook-bench-floor" --listen 127.0.0.1:19444 \
  --cert "$WORK/tls.crt" --key "$WORK/tls.key" --workers 1 >"$WORK/floor.log" 2>&1 &
PIDS+=($!)
TARGETS=("smolvm-webhook/validate 19443 /validate/smolvms"
         "smolvm-webhook/mutate 19443 /mutate/smolvms"
         "floor(parse+echo) 19444 /echo")
if [[ -n "${KUBE_EXAMPLE_BIN:-}" ]]; then
  cp "$WORK/tls.crt" "$WORK/admission-controller-tls.crt"
  cp "$WORK/tls.key" "$WORK/admission-controller-tls.key"
  (cd "$WORK" && ADMISSION_PRIVATE_IP=127.0.0.1 RUST_LOG=info \
     exec taskset -c "$SERVER_CPU" "$KUBE_EXAMPLE_BIN" >/dev/null 2>&1) &
  PIDS+=($!)
  TARGETS+=("kube-rs-example 8443 /mutate")
else
  echo "KUBE_EXAMPLE_BIN not set: the kube-rs example comparison is skipped"
fi

for port in 19443 19444 $([[ -n "${KUBE_EXAMPLE_BIN:-}" ]] && echo 8443); do
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/review.json", "rb"); wrk.body = f:read("*a"); f:close()
LUA

load() { taskset -c "$LOAD_CPU" "$BIN/webhook-bench-load" run --ca "$WORK/ca.crt" --body "$WORK/review.json" \
  --connections "$CONNS" --seconds "$SECS" "$@"; }

echo "== webhook-bench-load: maximum throughput"
for http in 1 2; do
  for t in "${TARGETS[@]}"; do
    read -r name port path <<<"$t"
    load --label "$name" --addr 127.0.0.1:$port --path "$path" --http $http --rate 0
  done
done
for rate in $RATES; do
  echo "== webhook-bench-load: fixed offered load $rate/s"
  for http in 1 2; do
    for t in "${TARGETS[@]}"; do
      read -r name port path <<<"$t"
      load --label "$name" --addr 127.0.0.1:$port --path "$path" --http $http --rate "$rate"
    done
  done
done
if command -v wrk >/dev/null; then
  echo "== wrk (HTTP/1.1, $CONNS connections, maximum throughput)"
  for t in "${TARGETS[@]}"; do
    read -r name port path <<<"$t"
    printf '%-28s ' "$name"
    taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$WORK/post.lua" "https://localhost:$port$path" \
      | awk '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} /^ +50%/ {p50=$2} END {printf "reviews/s=%s p50=%s p99=%s\n", rps, p50, p99}'
  done
fi
if command -v h2load >/dev/null; then
  # Fixed offered rate, as a second opinion on webhook-bench-load's: --rps per connection, up to
  # 4 requests in flight each, latency from each request's start (h2load's log), the first
  # 2 seconds left out as warm-up.
  h2load_latency() {
    awk -F'\t' 'NR == 1 || $1 < first {first = $1} {start[NR] = $1; us[NR] = $3}
      END {for (i = 1; i <= NR; i++) if (start[i] >= first + 2000000) print us[i]}' "$1" | sort -n |
      awk '{v[NR] = $1} END {if (NR == 0) {print "no samples"; exit}
        printf "requests=%d p50=%.3fms p99=%.3fms p99.9=%.3fms\n", NR,
          v[int(0.5 * (NR - 1)) + 1] / 1000, v[int(0.99 * (NR - 1)) + 1] / 1000, v[int(0.999 * (NR - 1)) + 1] / 1000}'
  }
  for rate in $RATES; do
    rps=$((rate / CONNS))
    echo "== h2load: fixed offered load $((rps * CONNS))/s ($CONNS connections x --rps $rps)"
    for proto in h1 h2; do
      for t in "${TARGETS[@]}"; do
        read -r name port path <<<"$t"
        printf '%-28s %-8s ' "$name" "$([[ $proto == h1 ]] && echo http/1.1 || echo http/2)"
        rm -f "$WORK/h2load.log"
        taskset -c "$LOAD_CPU" h2load $([[ $proto == h1 ]] && echo --h1) -t1 -c"$CONNS" -m4 --rps="$rps" -D $((SECS + 2)) \
          -H 'content-type: application/json' -d "$WORK/review.json" --log-file="$WORK/h2load.log" \
          "https://localhost:$port$path" >/dev/null 2>&1 || true
        if [[ -s "$WORK/h2load.log" ]]; then h2load_latency "$WORK/h2load.log"; else echo "no log"; fi
      done
    done
  done
  echo "== h2load (HTTP/2, $CONNS connections, 1 stream each, maximum throughput)"
  for t in "${TARGETS[@]}"; do
    read -r name port path <<<"$t"
    printf '%-28s ' "$name"
    taskset -c "$LOAD_CPU" h2load -t1 -c"$CONNS" -m1 -D"$SECS" --warm-up-time=2 -H 'content-type: application/json' \
      -d "$WORK/review.json" "https://localhost:$port$path" 2>/dev/null \
      | awk '/^finished in/ {rps=$4} /^requests:/ {ok=$8" ok, "$10" errored"} END {printf "reviews/s=%s %s\n", rps, ok}'
  done
fi
