#!/usr/bin/env bash
# Benchmark, not a test: RDMA WRITE 1 MiB bandwidth next to iperf3 single-stream TCP on 127.0.0.1,
# in one run, with the ratios:
#   - softrdma perf over soft-iWARP (MPA CRC off and on),
#   - softrdma perf over soft-RoCE (rxe_lo),
#   - Debian's ib_write_bw over soft-RoCE through the drop-in library.
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in iperf3 ib_write_bw; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is not installed (apt-get install iperf3 perftest)" >&2; exit 1; }
done
cargo build --release -q -p softrdma-cli
dropin=$(cargo xtask dropin 2>/dev/null | tail -1)
bin=target/release/softrdma
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
iperf() {
  local port; port=$(free_port)
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
ib_write_bw_rxe() {
  local port; port=$(free_port)
  LD_LIBRARY_PATH=$dropin ib_write_bw -d rxe_lo -s 1048576 -n 5000 -p "$port" >/dev/null 2>&1 &
  sleep 1
  # "#bytes #iterations peak average msgrate": average MB/s (10^6 B/s) -> Gbit/s
  LD_LIBRARY_PATH=$dropin ib_write_bw -d rxe_lo -s 1048576 -n 5000 -p "$port" 127.0.0.1 \
    | awk '$1 == 1048576 { printf "%.2f\n", $4 * 8 / 1000 }'
  wait
}
t1=$(iperf); w0=$(write_bw); w1=$(write_bw --mpa-crc); r0=$(write_bw -d rxe_lo); r1=$(ib_write_bw_rxe); t2=$(iperf)
python3 - "$t1" "$t2" "$w0" "$w1" "$r0" "$r1" <<'PY'
import sys
t1, t2, w0, w1, r0, r1 = map(float, sys.argv[1:])
t = (t1 + t2) / 2
print("| what | bandwidth | ratio to iperf3 |")
print("|---|---|---|")
print(f"| iperf3 single stream -l 1M | {t1:.1f} / {t2:.1f} Gbit/s (before / after) | 1.00 |")
print(f"| softrdma perf WRITE 1 MiB, soft-iWARP, CRC off | {w0:.1f} Gbit/s | {w0 / t:.2f}x |")
print(f"| softrdma perf WRITE 1 MiB, soft-iWARP, CRC on  | {w1:.1f} Gbit/s | {w1 / t:.2f}x |")
print(f"| softrdma perf WRITE 1 MiB, soft-RoCE (rxe_lo)  | {r0:.1f} Gbit/s | {r0 / t:.2f}x |")
print(f"| ib_write_bw 1 MiB, soft-RoCE (rxe_lo, drop-in) | {r1:.1f} Gbit/s | {r1 / t:.2f}x |")
PY
