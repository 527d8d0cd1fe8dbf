#!/usr/bin/env bash
# Benchmark, not a test: RDMA WRITE 1 MiB bandwidth (softrdma perf, MPA CRC off and on) next to
# iperf3 single-stream TCP on 127.0.0.1, in one run, with the ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v iperf3 >/dev/null || { echo "bench: iperf3 is not installed (apt-get install iperf3)" >&2; exit 1; }
cargo build --release -q -p softrdma-cli
bin=target/release/softrdma
iperf() {
  local port=$((20000 + RANDOM % 20000))
  iperf3 -s -B 127.0.0.1 -p "$port" -1 >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$port" -l 1M -t 5 -J | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9)'
  wait
}
write_bw() {
  local log; log=$(mktemp)
  "$bin" perf write-bw -b 127.0.0.1 -p 0 "$@" 2>"$log" &
  for _ in $(seq 100); do grep -q 'listening on' "$log" && break; sleep 0.05; done
  local port; port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$log")
  "$bin" perf write-bw 127.0.0.1 -p "$port" -s 1048576 -n 5000 --json "$@" | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbit_per_s"])'
  wait; rm -f "$log"
}
t1=$(iperf); w0=$(write_bw); w1=$(write_bw --mpa-crc); t2=$(iperf)
python3 - "$t1" "$t2" "$w0" "$w1" <<'PY'
import sys
t1, t2, w0, w1 = map(float, sys.argv[1:])
t = (t1 + t2) / 2
print(f"| iperf3 single stream -l 1M | {t1:.1f} / {t2:.1f} Gbit/s (before / after) | 1.00 |")
print(f"| softrdma WRITE 1 MiB, CRC off | {w0:.1f} Gbit/s | {w0 / t:.2f}x |")
print(f"| softrdma WRITE 1 MiB, CRC on  | {w1:.1f} Gbit/s | {w1 / t:.2f}x |")
PY
