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
#       directory holding admission-controller-tls.{crt,key}, logging at info to /dev/null;
#   (c) nginx answering a fixed review body (the practical limit of one core), when nginx is
#       installed (Debian nginx-light): one worker on the server's core, TLS 1.3 only, HTTP/1.1
#       and HTTP/2, the request body read and dropped. nginx may answer an HTTP/2 request before
#       it has read the body; webhook-bench-load then counted errors by the million in some runs
#       here (its figures for nginx over HTTP/2 are then not comparable), and h2load's maximum
#       throughput for nginx over HTTP/2 read low; its fixed-rate latency is the figure to use.
#
# Load: webhook-bench-load (Rust, verifies the certificate) for HTTP/1.1 and HTTP/2, maximum
# throughput and fixed offered rates with p50/p99/p99.9 (open loop, latency from each request's
# due time), every target in turn in short turns; plus, when installed (Debian packages wrk and
# nghttp2-client), wrk (HTTP/1.1) and h2load (HTTP/2) maximum throughput and h2load fixed-rate
# latency over both protocols as a second opinion (one target after another, at the same
# priority as webhook-bench-load's). wrk and h2load do not verify the certificate (they cannot
# be given a CA).
# Figures are printed, never asserted. At the end, each smolvm-webhook figure is set against
# kube-rs's example and nginx from the same run (throughput ratios, and p99 at 2000/s). What it
# printed on the development machine, and how to read it: docs/benchmarks.md, "History".
#
# Environment: SERVER_CPU (0), LOAD_CPU (1), SECONDS_PER_RUN (10), RATES ("2000 5000"),
# LATENCY_SECONDS (20: measured seconds per target at each fixed rate), LATENCY_PRIORITY (20:
# the SCHED_FIFO priority of the fixed-rate phases; empty for normal priority), IDLE_SPIN (1:
# busy loops at SCHED_IDLE on both cores during the fixed-rate phases; 0 for none),
# CONNECTIONS (16), KUBE_EXAMPLE_BIN (unset), NGINX (nginx on PATH; empty to skip),
# CARGO_TARGET_DIR.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
SECS=${SECONDS_PER_RUN:-10}
RATES=${RATES:-"2000 5000"}
CONNS=${CONNECTIONS:-16}

# The dist profile, as the image ships it (fat LTO; Cargo.toml says what it gives). The floor and
# the load generator are built with it too.
(cd "$ROOT" && cargo build --profile dist -p smolvm-webhook -p smolvm-webhook-bench --bins)
BIN=$TARGET/dist
WORK=$(mktemp -d)
PIDS=()
SPINNERS=()
cleanup() {
  for pid in "${PIDS[@]}" "${SPINNERS[@]}"; do kill "$pid" 2>/dev/null || true; done
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
# Each target: its name, port, path and the server's process id (for its CPU time).
TARGETS=("smolvm-webhook/validate 19443 /validate/smolvms ${PIDS[0]}"
         "smolvm-webhook/mutate 19443 /mutate/smolvms ${PIDS[0]}"
         "floor(parse+echo) 19444 /echo ${PIDS[1]}")
if [[ -n "${KUBE_EXAMPLE_BIN:-}" ]]; then
  cp "$WORK/tls.crt" "$WORK/admission-controller-tls.crt"
  cp "$WORK/tls.key" "$WORK/admission-controller-tls.key"
  (cd "$WORK" && ADMISSION_PRIVATE_IP=127.0.0.1 RUST_LOG=info \
     exec taskset -c "$SERVER_CPU" "$KUBE_EXAMPLE_BIN" >/dev/null 2>&1) &
  PIDS+=($!)
  TARGETS+=("kube-rs-example 8443 /mutate $!")
else
  echo "KUBE_EXAMPLE_BIN not set: the kube-rs example comparison is skipped"
fi
NGINX=${NGINX-$(command -v nginx || true)}
if [[ -n "$NGINX" ]]; then
  # The answer smolvm-webhook gives the review on /validate, as a fixed body.
  ANSWER='{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"0c9a8d74-9cb7-44dd-b98e-09fd62def2f4","allowed":true,"status":{}}}'
  mkdir -p "$WORK/nginx"
  cat >"$WORK/nginx/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $WORK/nginx/body;
  proxy_temp_path $WORK/nginx/proxy;
  fastcgi_temp_path $WORK/nginx/fastcgi;
  uwsgi_temp_path $WORK/nginx/uwsgi;
  scgi_temp_path $WORK/nginx/scgi;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:19445 ssl http2;
    ssl_certificate $WORK/tls.crt;
    ssl_certificate_key $WORK/tls.key;
    ssl_protocols TLSv1.3;
    client_max_body_size 1m;
    client_body_buffer_size 16k;
    location / {
      default_type application/json;
      return 200 '$ANSWER';
    }
  }
}
CONF
  taskset -c "$SERVER_CPU" "$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx/out.log" 2>&1 &
  PIDS+=($!)
  TARGETS+=("nginx(fixed) 19445 /answer $!")
else
  echo "nginx not installed: the fixed-answer comparison is skipped"
fi

# Every target's port answers before the load starts; and every target as webhook-bench-load
# compare takes it.
COMPARED=()
for t in "${TARGETS[@]}"; do
  read -r name port path _ <<<"$t"
  COMPARED+=(--target "$name=127.0.0.1:$port$path")
  for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
done

cat >"$WORK/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$WORK/review.json", "rb"); wrk.body = f:read("*a"); f:close()
LUA

# Every figure also goes to $WORK/results as "tool protocol measure target value" (measure:
# max for reviews/s at maximum throughput, p99@RATE for p99 in ms at a fixed rate), for the
# summary at the end.
record() { echo "$*" >>"$WORK/results"; }

# Maximum throughput: every target in turn too, in turns of 0.5 s (webhook-bench-load compare
# --rate 0), each target's reviews/s pooled over its turns. Here the host's speed drifted by up
# to 2x within seconds: the same server gave 18k and 28k reviews/s in two runs of 2 s, one after
# the other, and a ratio of two servers measured one after the other ranged from 0.34 to 0.70
# within minutes. In turns, a slow spell falls on every target alike. The lowest, median and
# highest of each target's turns are printed with it.
TURNS=$((SECS * 2))
# The host's steal time on both cores (/proc/stat), added up over each target's turns and
# printed with it: on a VM, the hypervisor running something else on these cores is what puts
# milliseconds into a p99 here, on whichever target's turn it falls (some runs here saw 0.5% of
# the time stolen, in bursts). A target whose p99 stands out beside a larger host-steal was
# measured through the host's stalls, not its own. At a fixed rate each line also gives the p99
# over the quiet slices alone (those in which no target's turn lost a tick to the host, the same
# slices for every target), and the summary sets it against nginx's beside the pooled p99,
# which stays the figure of record.
STEAL_CPUS="$SERVER_CPU,$LOAD_CPU"
echo "== webhook-bench-load: maximum throughput, ${SECS}s per target in $TURNS turns of 0.5s"
for http in 1 2; do
  taskset -c "$LOAD_CPU" "$BIN/webhook-bench-load" compare --ca "$WORK/ca.crt" --body "$WORK/review.json" \
    --connections "$CONNS" --seconds "$SECS" --slices "$TURNS" --http $http --rate 0 --steal-cpus "$STEAL_CPUS" \
    "${COMPARED[@]}" | tee -a "$WORK/load.txt"
done
# Latency at a fixed rate: every target in turn, in short turns (webhook-bench-load compare), so
# that the machine's stalls fall on every target alike, with the servers and the load at a
# real-time priority (SCHED_FIFO), so that the machine's other work does not preempt them.
# Without the turns, the p99 of the same server differed by 2x between runs minutes apart
# here; without the priority, tasks of the VM's own (its init runs at nice -10) added
# milliseconds to the p99.9 of every target. Both apply to every target alike.
realtime() { # on|off: the servers' scheduling policy, every thread of each and of its children
  [[ -n "$LATENCY_PRIORITY" ]] || return 0
  local pid
  for t in "${TARGETS[@]}"; do
    read -r _ _ _ pid <<<"$t"
    for p in "$pid" $(pgrep -P "$pid" || true); do
      if [[ $1 == on ]]; then chrt -a -f -p "$LATENCY_PRIORITY" "$p"; else chrt -a -o -p 0 "$p"; fi
    done
  done
}
LATENCY_PRIORITY=${LATENCY_PRIORITY-20}
if [[ -n "$LATENCY_PRIORITY" ]] && ! chrt -f "$LATENCY_PRIORITY" true 2>/dev/null; then
  echo "cannot run at SCHED_FIFO priority $LATENCY_PRIORITY here (needs CAP_SYS_NICE): latency is measured at normal priority"
  LATENCY_PRIORITY=
fi
at_priority() { if [[ -n "$LATENCY_PRIORITY" ]]; then chrt -f "$LATENCY_PRIORITY" "$@"; else "$@"; fi; }
LATENCY_SECS=${LATENCY_SECONDS:-20}
# Idle spinners: during the fixed-rate phases, a busy loop at SCHED_IDLE on the server's core and
# on the load's, which any other task there preempts at once. At 2,000 reviews/s both cores are
# mostly idle; on a VM, an idle vCPU halts and the host may take milliseconds to run it again.
# Here, without them, the generator itself sent late by 1-4 ms at p99 and nginx's p99 was
# 2-9 ms; with them, 0.05 ms and 0.3 ms. The fixed-rate figures then measure the servers, not
# the host's wake-ups; they apply to every target alike.
IDLE_SPIN=${IDLE_SPIN:-1}
spinners() { # on|off
  local cpu pid
  if [[ $1 == on && $IDLE_SPIN == 1 ]]; then
    for cpu in "$SERVER_CPU" "$LOAD_CPU"; do
      chrt -i 0 taskset -c "$cpu" bash -c 'while :; do :; done' &
      SPINNERS+=($!)
    done
  elif [[ $1 == off ]]; then
    for pid in "${SPINNERS[@]}"; do kill "$pid" 2>/dev/null || true; done
    SPINNERS=()
  fi
}
[[ $IDLE_SPIN == 1 ]] && echo "fixed-rate phases: a SCHED_IDLE busy loop on cores $SERVER_CPU and $LOAD_CPU keeps them from halting (IDLE_SPIN=0 for none)"
realtime on
spinners on
for rate in $RATES; do
  echo "== webhook-bench-load: fixed offered load $rate/s, ${LATENCY_SECS}s per target in turns of 0.5s${LATENCY_PRIORITY:+, SCHED_FIFO $LATENCY_PRIORITY}"
  for http in 1 2; do
    at_priority taskset -c "$LOAD_CPU" "$BIN/webhook-bench-load" compare --ca "$WORK/ca.crt" --body "$WORK/review.json" \
      --connections "$CONNS" --seconds "$LATENCY_SECS" --slices $((LATENCY_SECS * 2)) --http $http --rate "$rate" \
      --steal-cpus "$STEAL_CPUS" "${COMPARED[@]}" | tee -a "$WORK/load.txt"
  done
done
spinners off
realtime off
awk '{ match($0, /offered=[^ ]+/); offered = substr($0, RSTART + 8, RLENGTH - 8)
  match($0, /reviews\/s= *[0-9]+/); rps = substr($0, RSTART, RLENGTH); gsub(/[^0-9]/, "", rps)
  match($0, / p99=[0-9.]+/); p99 = substr($0, RSTART + 5, RLENGTH - 5)
  steal = ""; if (match($0, /host-steal=[0-9]+/)) steal = substr($0, RSTART + 11, RLENGTH - 11)
  quiet = ""; if (match($0, /p99-quiet=[0-9.]+/)) quiet = substr($0, RSTART + 10, RLENGTH - 10)
  slices = ""; if (match($0, /quiet-slices=[0-9]+\/[0-9]+/)) slices = substr($0, RSTART + 13, RLENGTH - 13)
  if (offered == "max") print "bench-load", $2, "max", $1, rps
  else {
    print "bench-load", $2, "p99@" offered, $1, p99
    if (steal != "") print "bench-load", $2, "steal@" offered, $1, steal
    if (quiet != "") print "bench-load", $2, "quiet@" offered, $1, quiet
    if (slices != "") print "bench-load", $2, "slices@" offered, $1, slices
  }
}' "$WORK/load.txt" >>"$WORK/results"
# The CPU time (clock ticks) of process $1 and its children (nginx's worker), so far.
cpu_ticks() {
  local total=0 pid stat
  for pid in "$1" $(pgrep -P "$1" || true); do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    read -r -a f <<<"${stat##*) }"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}
TICKS=$(getconf CLK_TCK)
if command -v wrk >/dev/null; then
  # Also the server's CPU time per review over the run, which other work on the machine
  # changes less than it changes throughput.
  echo "== wrk (HTTP/1.1, $CONNS connections, maximum throughput)"
  for t in "${TARGETS[@]}"; do
    read -r name port path pid <<<"$t"
    printf '%-28s ' "$name"
    before=$(cpu_ticks "$pid")
    out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${SECS}s" --latency -s "$WORK/post.lua" "https://localhost:$port$path" \
      | awk '/Requests\/sec/ {rps=$2} /^ +99%/ {p99=$2} /^ +50%/ {p50=$2} / requests in / {n=$1}
          END {printf "reviews/s=%s p50=%s p99=%s requests=%s\n", rps, p50, p99, n}')
    after=$(cpu_ticks "$pid")
    n=$(sed -E 's/.*requests=([0-9]+).*/\1/' <<<"$out")
    cpu=$(awk -v t=$((after - before)) -v hz="$TICKS" -v n="$n" 'BEGIN {if (n > 0) printf "%.1f", t / hz * 1e6 / n}')
    out="$out server-cpu-us/review=$cpu"
    echo "$out"
    record wrk http/1.1 max "$name" "$(sed -E 's/^reviews\/s=([0-9.]+).*/\1/' <<<"$out")"
    record wrk http/1.1 cpu-us "$name" "$cpu"
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
  realtime on
  spinners on
  for rate in $RATES; do
    rps=$((rate / CONNS))
    echo "== h2load: fixed offered load $((rps * CONNS))/s ($CONNS connections x --rps $rps)"
    for proto in h1 h2; do
      for t in "${TARGETS[@]}"; do
        read -r name port path _ <<<"$t"
        printf '%-28s %-8s ' "$name" "$([[ $proto == h1 ]] && echo http/1.1 || echo http/2)"
        rm -f "$WORK/h2load.log"
        at_priority taskset -c "$LOAD_CPU" h2load $([[ $proto == h1 ]] && echo --h1) -t1 -c"$CONNS" -m4 --rps="$rps" -D $((SECS + 2)) \
          -H 'content-type: application/json' -d "$WORK/review.json" --log-file="$WORK/h2load.log" \
          "https://localhost:$port$path" >/dev/null 2>&1 || true
        if [[ -s "$WORK/h2load.log" ]]; then
          out=$(h2load_latency "$WORK/h2load.log")
          echo "$out"
          record h2load "$([[ $proto == h1 ]] && echo http/1.1 || echo http/2)" "p99@$((rps * CONNS))" "$name" \
            "$(sed -nE 's/.* p99=([0-9.]+)ms.*/\1/p' <<<"$out")"
        else
          echo "no log"
        fi
      done
    done
  done
  spinners off
  realtime off
  echo "== h2load (HTTP/2, $CONNS connections, 1 stream each, maximum throughput)"
  for t in "${TARGETS[@]}"; do
    read -r name port path _ <<<"$t"
    printf '%-28s ' "$name"
    out=$(taskset -c "$LOAD_CPU" h2load -t1 -c"$CONNS" -m1 -D"$SECS" --warm-up-time=2 -H 'content-type: application/json' \
      -d "$WORK/review.json" "https://localhost:$port$path" 2>/dev/null \
      | awk '/^finished in/ {rps=$4} /^requests:/ {ok=$8" ok, "$10" errored"} END {printf "reviews/s=%s %s\n", rps, ok}')
    echo "$out"
    record h2load http/2 max "$name" "$(sed -E 's/^reviews\/s=([0-9.]+).*/\1/' <<<"$out")"
  done
fi

# Each smolvm-webhook figure against the peers of this run: throughput and CPU time per review
# as multiples of kube-rs's example's and of nginx's, p99 as a multiple of nginx's (with the host
# steal time of each one's turns).
echo "== smolvm-webhook against the peers of this run"
awk '{ key = $1 " " $2 " " $3; v[key " " $4] = $5; if (!(key in seen)) { seen[key] = 1; keys[++n] = key } }
  END {
    split("smolvm-webhook/validate smolvm-webhook/mutate", names, " ")
    for (i = 1; i <= n; i++) {
      split(keys[i], k, " ")
      kube = v[keys[i] " kube-rs-example"]; ng = v[keys[i] " nginx(fixed)"]
      for (j = 1; j <= 2; j++) {
        x = v[keys[i] " " names[j]]
        if (x == "") continue
        if (k[3] == "max") {
          line = sprintf("%-10s %-8s %-24s reviews/s=%-9s", k[1], k[2], names[j], x)
          if (kube + 0 > 0) line = line sprintf(" x%.2f kube-rs", x / kube)
          if (ng + 0 > 0) line = line sprintf(" x%.2f nginx", x / ng)
        } else if (k[3] == "cpu-us") {
          line = sprintf("%-10s %-8s %-24s server-cpu-us/review=%-6s", k[1], k[2], names[j], x)
          if (kube + 0 > 0) line = line sprintf(" x%.2f kube-rs", x / kube)
          if (ng + 0 > 0) line = line sprintf(" x%.2f nginx", x / ng)
        } else if (k[3] ~ /^(steal|quiet|slices)@/) {
          continue
        } else {
          line = sprintf("%-10s %-8s %-24s %s=%sms", k[1], k[2], names[j], k[3], x)
          if (ng + 0 > 0) line = line sprintf(" x%.2f nginx (%sms)", x / ng, ng)
          at = substr(k[3], 5)
          steal = k[1] " " k[2] " steal@" at
          if ((steal " " names[j]) in v) line = line sprintf(" host-steal=%sms (nginx %sms)", v[steal " " names[j]], v[steal " nginx(fixed)"])
          # The p99 over the slices the host took nothing from (the same slices for every target).
          quiet = k[1] " " k[2] " quiet@" at; qx = v[quiet " " names[j]]; qn = v[quiet " nginx(fixed)"]
          if (qx != "" && qn + 0 > 0) line = line sprintf("; quiet slices %s: x%.2f nginx (%sms, nginx %sms)", v[k[1] " " k[2] " slices@" at " " names[j]], qx / qn, qx, qn)
        }
        print line
      }
    }
  }' "$WORK/results"
