# What webhook/bench's scripts that run the real smolvm-webhook alone share (sourced, not run):
# the bench build of the binaries, a work directory with the generated TLS files and review, the
# cleanup of both on exit, and starting the webhook on a port and waiting for it.
#
# Sets ROOT, TARGET, BIN, WORK and PID; start_webhook LISTEN_PORT OPS_PORT [FLAG...] starts the
# webhook (its log in $WORK/webhook.log, its pid in $PID) and returns once it accepts; stop_webhook
# stops it.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

(cd "$ROOT" && cargo build --release -p smolvm-webhook -p smolvm-webhook-bench --bins)
BIN=$TARGET/release
WORK=$(mktemp -d)
PID=
cleanup() {
  [[ -n "$PID" ]] && kill "$PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BIN/webhook-bench-load" gen "$WORK" >/dev/null

start_webhook() {
  local port=$1 ops=$2
  shift 2
  "$BIN/smolvm-webhook" --without-cluster --tls-mode files \
    --tls-cert "$WORK/tls.crt" --tls-key "$WORK/tls.key" \
    --listen "127.0.0.1:$port" --ops-address "127.0.0.1:$ops" "$@" >"$WORK/webhook.log" 2>&1 &
  PID=$!
  for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done
}

stop_webhook() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  PID=
}
