#!/usr/bin/env bash
# The loopback demo: the devices, an RDMA CM session on 127.0.0.1 showing every CM event
# (cmatose), rping (SEND + RDMA READ + RDMA WRITE), then a short bandwidth/latency table
# (softrdma perf) over soft-iWARP, and the same CM session and a WRITE table over soft-RoCE
# (rxe_lo). Server and client are separate processes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p softrdma-cli
bin=target/release/softrdma
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== softrdma devices"
"$bin" devices

echo; echo "== softrdma cmatose -b 127.0.0.1 (server) / -s 127.0.0.1 (client), CM events shown, every byte verified"
port=$(free_port)
"$bin" cmatose -b 127.0.0.1 -p "$port" -C 5 -v --verify | sed 's/^/  server| /' & pids+=($!)
sleep 0.3
"$bin" cmatose -s 127.0.0.1 -p "$port" -C 5 -v --verify | sed 's/^/  client| /'
wait "${pids[-1]}"

echo; echo "== softrdma rping -s / -c -a 127.0.0.1 -C 3 -V -v"
port=$(free_port)
"$bin" rping -s -a 127.0.0.1 -p "$port" -V & pids+=($!)
sleep 0.3
"$bin" rping -c -a 127.0.0.1 -p "$port" -C 3 -V -v
wait "${pids[-1]}"

echo; echo "== softrdma perf (two processes on 127.0.0.1, data verified)"
for t in send-bw write-bw read-bw send-lat write-lat read-lat; do
  log=$(mktemp)
  "$bin" perf "$t" -b 127.0.0.1 -p 0 2>"$log" & pids+=($!)
  for _ in $(seq 100); do grep -q 'listening on' "$log" && break; sleep 0.05; done
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$log")
  echo "-- $t"
  timeout 120 "$bin" perf "$t" 127.0.0.1 -p "$port" -s 64,4096,1048576 -n 300 | grep -v '^#'
  wait "${pids[-1]}"
  rm -f "$log"
done

echo; echo "== soft-RoCEv2: the same CM session over rxe_lo (IB CM MADs on UDP 4791), SOFTRDMA_TRANSPORTS=roce"
port=$(free_port)
SOFTRDMA_TRANSPORTS=roce "$bin" cmatose -b 127.0.0.1 -p "$port" -C 5 -v --verify | sed 's/^/  server| /' & pids+=($!)
sleep 0.3
SOFTRDMA_TRANSPORTS=roce "$bin" cmatose -s 127.0.0.1 -p "$port" -C 5 -v --verify | sed 's/^/  client| /'
wait "${pids[-1]}"

echo; echo "== softrdma perf write-bw -d rxe_lo (RC over UDP, data verified)"
log=$(mktemp)
"$bin" perf write-bw -b 127.0.0.1 -p 0 -d rxe_lo 2>"$log" & pids+=($!)
for _ in $(seq 100); do grep -q 'listening on' "$log" && break; sleep 0.05; done
port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$log")
timeout 120 "$bin" perf write-bw 127.0.0.1 -p "$port" -d rxe_lo -s 64,4096,1048576 -n 300 | grep -v '^#'
wait "${pids[-1]}"
rm -f "$log"
