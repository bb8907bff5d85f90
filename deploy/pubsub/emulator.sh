#!/usr/bin/env bash
# gcloud's Pub/Sub emulator on loopback, for `kvtrace anonymize --streaming` on this machine.
#
#   deploy/pubsub/emulator.sh start [PORT]   # returns once it serves; prints the export to use
#   deploy/pubsub/emulator.sh stop
#
# Needs the Google Cloud CLI with its Pub/Sub emulator component (and Java). State lives in
# KVTRACE_PUBSUB_HOME (default ~/.cache/kvtrace/pubsub-emulator): its data, pid and log.
set -euo pipefail

home="${KVTRACE_PUBSUB_HOME:-$HOME/.cache/kvtrace/pubsub-emulator}"
start_timeout_s=120  # a cold JVM on a busy 2-core machine

start() {
  local port="${1:-8085}"
  command -v gcloud >/dev/null || { echo "error: gcloud is not installed" >&2; exit 2; }
  if [[ -f "$home/pid" ]] && kill -0 "$(cat "$home/pid")" 2>/dev/null; then
    echo "export PUBSUB_EMULATOR_HOST=$(cat "$home/address")"; return
  fi
  mkdir -p "$home/data"
  : > "$home/log"
  setsid gcloud beta emulators pubsub start --host-port="127.0.0.1:$port" \
    --data-dir="$home/data" >"$home/log" 2>&1 &
  echo $! > "$home/pid"
  echo "127.0.0.1:$port" > "$home/address"
  for _ in $(seq "$start_timeout_s"); do
    if grep -q "Server started" "$home/log"; then
      echo "export PUBSUB_EMULATOR_HOST=127.0.0.1:$port"; return
    fi
    kill -0 "$(cat "$home/pid")" 2>/dev/null || break
    sleep 1
  done
  echo "error: the Pub/Sub emulator did not start; its log: $home/log" >&2
  tail -5 "$home/log" >&2
  stop
  exit 1
}

stop() {
  if [[ -f "$home/pid" ]]; then
    kill -- -"$(cat "$home/pid")" 2>/dev/null || true  # the whole session: gcloud and its JVM
    rm -f "$home/pid"
  fi
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop ;;
  *) echo "usage: $0 start [PORT] | stop" >&2; exit 2 ;;
esac
