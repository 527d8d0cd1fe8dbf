#!/usr/bin/env bash
# Benchmark, not a test: softrdma next to the TCP tools users know, on 127.0.0.1, in one run, and
# one markdown table of ratios (softrdma ÷ reference, every pair measured in this run):
#   bandwidth, 1 MiB, against iperf3 single stream `-l 1M` (run before and after, averaged):
#     - softrdma perf write-bw over soft-iWARP (MPA CRC off and on) and soft-RoCE (rxe_lo),
#     - Debian's ib_write_bw over rxe_lo and `ib_write_bw -R` (rdma_cm) over siw_lo, both
#       through the drop-in library;
#   latency, 8 B, one-way (a READ: its round trip), against sockperf TCP ping-pong (14 B, its
#   smallest message; one-way = RTT/2); medians, the means next to them:
#     - ib_send_lat, ib_write_lat, ib_read_lat over rxe_lo and (with -R, rdma_cm) over siw_lo
#       (perftest polls its CQ) against
#       sockperf busy-poll (`--nonblocked`, the server's epoll timeout 0),
#     - ib_send_lat -e and `softrdma perf send-lat --events` (both sleep on a completion
#       channel) against sockperf blocking;
#   connection setup: crates/cm/examples/conn_rate.rs (softrdma-cm create, resolve, QPs,
#     connect, accept, disconnect, destroy on siw_lo, then over the IB CM on rxe_lo) against
#     raw TCP connect+accept+close,
#     which the example measures itself, in the same process (as root, in a network namespace
#     of its own that keeps no TIME_WAIT sockets; see cm_rate).
# Takes about 1 min after the release build on 2 vCPUs (BENCH_QUICK=1: shorter runs, about 20 s,
# to check that every row gives a number; its numbers are noisier). Nothing is pinned to a CPU:
# run it on a quiet machine and compare ratios, not absolute numbers. The devices are the
# defaults (siw_lo, rxe_lo): SOFTRDMA_CONFIG and
# SOFTRDMA_TRANSPORTS are unset. All traffic is to 127.0.0.1 (perftest's servers listen on
# 0.0.0.0; perftest has no option to bind them). A row without a number reads "failed", the
# logs are kept and the exit status is 1.
set -euo pipefail
cd "$(dirname "$0")/.."
unset SOFTRDMA_CONFIG SOFTRDMA_TRANSPORTS

missing=() packages=()
need() { # need TOOL DEBIAN-PACKAGE
  command -v "$1" >/dev/null && return
  missing+=("$1")
  [[ " ${packages[*]} " == *" $2 "* ]] || packages+=("$2")
}
need iperf3 iperf3
need sockperf sockperf
for t in ib_write_bw ib_send_lat ib_write_lat ib_read_lat; do need "$t" perftest; done
need ss iproute2
need python3 python3
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: ${missing[*]} not installed (apt-get install ${packages[*]})" >&2
  exit 1
fi

if [ "${BENCH_QUICK:-0}" = 1 ]; then
  secs=1 bw_n=500 lat_n=1000 conns=50
else
  secs=5 bw_n=5000 lat_n=5000 conns=500
fi

cargo build --release -q -p softrdma-cli
cargo build --release -q -p softrdma-cm --example conn_rate
dropin=$(cargo xtask dropin 2>/dev/null | tail -1)
target=${CARGO_TARGET_DIR:-target}
bin=$target/release/softrdma
conn_rate=$target/release/examples/conn_rate

work=$(mktemp -d -t softrdma-bench.XXXXXX)
pids=()   # background servers still running
cm_ns=()  # the prefix that runs conn_rate in its own network namespace (see below)
cleanup() {
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ ${#cm_ns[@]} -gt 0 ]; then ip netns del "${cm_ns[3]}" 2>/dev/null || true; fi
  if [ "${keep_logs:-0}" = 1 ]; then echo "bench: logs in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
num() { [[ ${1:-} =~ ^[0-9]+([.][0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
# serve LOG CMD...: a server in the background, bounded; its pid in $srv
serve() {
  local log=$1; shift
  timeout -k 5 120 "$@" >"$log" 2>&1 &
  srv=$!
  pids+=("$srv")
}
# reap [kill]: wait for the last server to end (it is bounded by its timeout), or stop it first
reap() {
  [ "${1:-}" = kill ] && kill "$srv" 2>/dev/null
  wait "$srv" 2>/dev/null || true
  local keep=() p
  for p in "${pids[@]}"; do [ "$p" = "$srv" ] || keep+=("$p"); done
  pids=("${keep[@]}")
}
# client LOG CMD...: a bounded client, stdout and stderr to LOG
client() {
  local log=$1; shift
  timeout --foreground -k 5 120 "$@" >"$log" 2>&1 || echo "bench: exit status $? from: $*" >>"$log"
}
# wait_tcp PORT: until something listens on TCP PORT (5 s at most)
wait_tcp() {
  for _ in $(seq 100); do ss -Hltn "sport = :$1" | grep -q . && return 0; sleep 0.05; done
  return 1
}
declare -A val   # every measured number, by name; a missing one is a failed measurement

# iperf NAME: iperf3 single stream, 1 MiB writes; Gbit/s received
iperf() {
  local port; port=$(free_port)
  serve "$work/$1.srv" iperf3 -s -B 127.0.0.1 -p "$port" -1
  wait_tcp "$port" || true
  client "$work/$1.log" iperf3 -c 127.0.0.1 -p "$port" -l 1M -t "$secs" -J
  reap
  val[$1]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"]/1e9)' \
    "$work/$1.log" 2>/dev/null || true)
}
# softrdma_perf NAME TEST SIZE ITERS ARGS...: a softrdma perf server (any free port) and client,
# both with ARGS; the client's JSON line is left in $work/NAME.log
softrdma_perf() {
  local name=$1 test=$2 size=$3 iters=$4 port=""; shift 4
  serve "$work/$name.srv" "$bin" perf "$test" -b 127.0.0.1 -p 0 "$@"
  for _ in $(seq 100); do grep -q 'listening on' "$work/$name.srv" && break; sleep 0.05; done
  port=$(sed -n 's/.*listening on .*:\([0-9]*\)$/\1/p' "$work/$name.srv")
  client "$work/$name.log" "$bin" perf "$test" 127.0.0.1 -p "${port:-0}" -s "$size" -n "$iters" --json "$@"
  reap
}
# json_field NAME FIELD: FIELD of the JSON line in $work/NAME.log (empty if there is none)
json_field() {
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())[sys.argv[2]])' \
    "$work/$1.log" "$2" 2>/dev/null || true
}
# write_bw NAME ARGS...: softrdma perf write-bw 1 MiB; Gbit/s
write_bw() {
  softrdma_perf "$1" write-bw 1048576 "$bw_n" "${@:2}"
  val[$1]=$(json_field "$1" gbit_per_s)
}
# perftest NAME TOOL ARGS...: a perftest server and client through the drop-in library
perftest() {
  local name=$1 tool=$2 port; shift 2
  port=$(free_port)
  serve "$work/$name.srv" env LD_LIBRARY_PATH="$dropin" "$tool" -p "$port" "$@"
  wait_tcp "$port" || true
  client "$work/$name.log" env LD_LIBRARY_PATH="$dropin" "$tool" -p "$port" "$@" 127.0.0.1
  reap
}
# perf_lat NAME ARGS...: softrdma perf send-lat 8 B; median one-way latency in µs (p99 beside it)
perf_lat() {
  softrdma_perf "$1" send-lat 8 "$lat_n" "${@:2}"
  val[$1]=$(json_field "$1" p50_us)
  val[$1.p99]=$(json_field "$1" p99_us)
}
# ib_bw NAME ARGS...: ib_write_bw 1 MiB; "#bytes #iterations peak average msgrate", in Gbit/s
ib_bw() {
  local name=$1; shift
  perftest "$name" ib_write_bw -s 1048576 -n "$bw_n" --report_gbits "$@"
  val[$name]=$(awk '$1 == 1048576 && NF >= 4 { print $4 }' "$work/$name.log")
}
# ib_lat NAME TOOL ARGS...: perftest latency, 8 B; t_typical (median) and t_avg in µs, one-way
# for SEND and WRITE (perftest halves the round trip), the whole round trip for READ; ARGS name
# the device (-d)
ib_lat() {
  local name=$1 tool=$2; shift 2
  perftest "$name" "$tool" -s 8 -n "$lat_n" "$@"
  val[$name]=$(awk '$1 == 8 && NF >= 6 { print $5 }' "$work/$name.log")
  val[$name.avg]=$(awk '$1 == 8 && NF >= 6 { print $6 }' "$work/$name.log")
}
# sockperf NAME busy|block: TCP ping-pong 14 B; median and mean one-way latency (RTT/2) in µs
sockperf_pp() {
  local name=$1 port srv_flags=() cli_flags=(); port=$(free_port)
  [ "$2" = busy ] && { srv_flags=(--nonblocked --timeout 0); cli_flags=(--nonblocked); }
  serve "$work/$name.srv" sockperf sr --tcp -i 127.0.0.1 -p "$port" "${srv_flags[@]}"
  wait_tcp "$port" || true
  client "$work/$name.log" sockperf pp --tcp -i 127.0.0.1 -p "$port" -m 14 -t "$secs" "${cli_flags[@]}"
  reap kill
  sed -i 's/\x1b\[[0-9;]*m//g' "$work/$name.log"
  val[$name]=$(awk '/percentile 50.000/ { print $NF }' "$work/$name.log")
  val[$name.avg]=$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' "$work/$name.log")
}
# cm_rate NAME TRANSPORTS: the conn_rate example's row "| N | CM conn/s (µs) | TCP conn/s (µs)
# | TCP/CM |" with SOFTRDMA_TRANSPORTS=TRANSPORTS (over 127.0.0.1, iwarp: siw_lo, roce: rxe_lo)
cm_rate() {
  local name=$1
  client "$work/$name.log" "${cm_ns[@]}" env SOFTRDMA_TRANSPORTS="$2" "$conn_rate" "$conns"
  read -r "val[$name]" "val[$name.us]" "val[tcp$name]" "val[tcp$name.us]" < <(awk -F'|' 'NF >= 5 && $2 + 0 > 0 {
      gsub(/[()]/, "", $3); gsub(/[()]/, "", $4); print $3, $4 }' "$work/$name.log") || true
}

iperf iperf1
write_bw w0
write_bw w1 --mpa-crc
write_bw r0 -d rxe_lo
ib_bw r1 -d rxe_lo
ib_bw siw1 -R -d siw_lo
iperf iperf2
sockperf_pp busy busy
ib_lat send_lat ib_send_lat -d rxe_lo
ib_lat write_lat ib_write_lat -d rxe_lo
ib_lat read_lat ib_read_lat -d rxe_lo
ib_lat send_lat_iw ib_send_lat -R -d siw_lo
ib_lat write_lat_iw ib_write_lat -R -d siw_lo
ib_lat read_lat_iw ib_read_lat -R -d siw_lo
sockperf_pp block block
ib_lat send_lat_ev ib_send_lat -e -d rxe_lo
perf_lat perf_ev_iw --events
perf_lat perf_ev_roce --events -d rxe_lo
# Each connection cycle leaves a TIME_WAIT socket (about 2,000 a run), and thousands of them
# slow connect() itself: as root, conn_rate runs in a network namespace of its own (loopback
# only) that keeps none, so that one run does not slow the next.
if [ "$(id -u)" = 0 ] && command -v ip >/dev/null; then
  ns=softrdma-bench-$$
  if ip netns add "$ns" && ip netns exec "$ns" ip link set lo up &&
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_max_tw_buckets=0; then
    cm_ns=(ip netns exec "$ns")
  else
    ip netns del "$ns" 2>/dev/null || true
    echo "bench: no network namespace for conn_rate; it runs on the host" >&2
  fi
fi
cm_rate cm iwarp
cm_rate cmr roce

failed=()
for k in iperf1 iperf2 w0 w1 r0 r1 siw1 busy busy.avg send_lat send_lat.avg write_lat write_lat.avg read_lat \
  read_lat.avg send_lat_iw send_lat_iw.avg write_lat_iw write_lat_iw.avg read_lat_iw read_lat_iw.avg block block.avg send_lat_ev send_lat_ev.avg perf_ev_iw perf_ev_iw.p99 perf_ev_roce perf_ev_roce.p99 cm cm.us tcpcm tcpcm.us cmr cmr.us tcpcmr tcpcmr.us; do
  if num "${val[$k]:-}"; then printf '%s=%s\n' "$k" "${val[$k]}"; else failed+=("$k"); fi
done >"$work/values"
python3 - "$work/values" "$conns" <<'PY'
import sys
v = {}
for line in open(sys.argv[1]):
    k, x = line.strip().split("=")
    v[k] = float(x)
conns = int(sys.argv[2])
print("| what | softrdma | reference, same run | softrdma ÷ reference | better |")
print("|---|---|---|---|---|")
def row(what, s, s_text, r, r_text, better):
    if s is None or r is None:
        print(f"| {what} | {s_text if s is not None else 'failed'} | {r_text if r is not None else 'failed'} | – | {better} |")
    else:
        print(f"| {what} | {s_text} | {r_text} | {s / r:.2f} | {better} |")
t1, t2 = v.get("iperf1"), v.get("iperf2")
tcp = (t1 + t2) / 2 if t1 is not None and t2 is not None else None
tcp_text = f"iperf3 -l 1M: {tcp:.1f} Gbit/s ({t1:.1f} before, {t2:.1f} after)" if tcp is not None else None
for key, what in [
    ("w0", "softrdma perf write-bw 1 MiB, soft-iWARP, CRC off"),
    ("w1", "softrdma perf write-bw 1 MiB, soft-iWARP, CRC on"),
    ("r0", "softrdma perf write-bw 1 MiB, soft-RoCE (rxe_lo)"),
    ("r1", "ib_write_bw 1 MiB, soft-RoCE (rxe_lo, drop-in)"),
    ("siw1", "ib_write_bw -R 1 MiB, soft-iWARP (siw_lo, rdma_cm, drop-in)"),
]:
    s = v.get(key)
    row(what, s, f"{s:.1f} Gbit/s" if s is not None else "", tcp, tcp_text, "higher")

def lat(k):
    return f"{v[k]:.1f} µs (mean {v[k + '.avg']:.1f})" if k in v and k + ".avg" in v else None
busy, block = lat("busy"), lat("block")
busy_text = f"sockperf TCP 14 B busy-poll, one-way: {busy}" if busy else None
block_text = f"sockperf TCP 14 B blocking, one-way: {block}" if block else None
rtt = f"sockperf TCP 14 B busy-poll, round trip: {2 * v['busy']:.1f} µs (mean {2 * v['busy.avg']:.1f})" if busy else None
for key, what, ref, ref_text in [
    ("send_lat", "ib_send_lat 8 B, rxe_lo, polling, one-way", v.get("busy"), busy_text),
    ("write_lat", "ib_write_lat 8 B, rxe_lo, polling, one-way", v.get("busy"), busy_text),
    ("read_lat", "ib_read_lat 8 B, rxe_lo, polling, round trip", 2 * v["busy"] if busy else None, rtt),
    ("send_lat_iw", "ib_send_lat -R 8 B, siw_lo, polling, one-way", v.get("busy"), busy_text),
    ("write_lat_iw", "ib_write_lat -R 8 B, siw_lo, polling, one-way", v.get("busy"), busy_text),
    ("read_lat_iw", "ib_read_lat -R 8 B, siw_lo, polling, round trip", 2 * v["busy"] if busy else None, rtt),
    ("send_lat_ev", "ib_send_lat -e 8 B, rxe_lo, completion channel, one-way", v.get("block"), block_text),
]:
    row(what, v.get(key) if lat(key) else None, lat(key), ref, ref_text, "lower")
for key, what in [
    ("perf_ev_iw", "softrdma perf send-lat --events 8 B, soft-iWARP, completion channel, one-way"),
    ("perf_ev_roce", "softrdma perf send-lat --events 8 B, soft-RoCE (rxe_lo), completion channel, one-way"),
]:
    s = v.get(key)
    s_text = f"{s:.1f} µs (p99 {v[key + '.p99']:.1f})" if s is not None and key + ".p99" in v else None
    row(what, s if s_text else None, s_text, v.get("block"), block_text, "lower")
for key, dev in [("cm", "siw_lo"), ("cmr", "rxe_lo, IB CM")]:
    cm = f"{v[key]:.0f} conn/s ({v[key + '.us']:.0f} µs)" if key in v and key + ".us" in v else None
    t = "tcp" + key
    tc = f"TCP connect+accept+close: {v[t]:.0f} conn/s ({v[t + '.us']:.0f} µs)" if t in v and t + ".us" in v else None
    row(f"softrdma-cm connection cycles (conn_rate, {conns}, {dev})", v.get(key) if cm else None, cm,
        v.get(t) if tc else None, tc, "higher")
PY
if [ ${#failed[@]} -gt 0 ]; then
  keep_logs=1
  echo "bench: no number for: ${failed[*]}" >&2
  exit 1
fi
