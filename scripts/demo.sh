#!/usr/bin/env bash
# The loopback demo: list the devices, then run every `softrdma perf` test between two
# processes on 127.0.0.1 (server and client), with data verification.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p softrdma-cli
bin=target/release/softrdma
echo "== softrdma devices"
"$bin" devices
for t in send-bw write-bw read-bw send-lat write-lat read-lat; do
  log=$(mktemp)
  "$bin" perf "$t" -b 127.0.0.1 -p 0 2>"$log" &
  server=$!
  trap 'kill $server 2>/dev/null || true; rm -f "$log"' EXIT
  for _ in $(seq 100); do grep -q 'listening on' "$log" && break; sleep 0.05; done
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$log")
  echo
  echo "== softrdma perf $t 127.0.0.1 -p $port"
  timeout 120 "$bin" perf "$t" 127.0.0.1 -p "$port" -s 1,4096,1048576 -n 300
  wait "$server"
  rm -f "$log"
  trap - EXIT
done
