#!/usr/bin/env bash
# Benchmark, not a test: each engine over softrdma's soft-RoCE next to the same engine's own
# TCP path, in one run, one table of ratios (softrdma ÷ TCP):
#   - UCX 1.13: ucx_perftest UCT put_bw 1 MiB (rc_verbs zcopy vs tcp zcopy), UCP tag_lat 8 B
#     (UCX_TLS=rc_verbs,ud_verbs vs UCX_TLS=tcp), server in host a, client in host b;
#   - Open MPI 4.1: tools/bench/mpi_pingpong.c, 2 ranks in host a, pml ucx on the soft-RoCE
#     device vs pml ob1 + btl tcp: 8 B ping-pong latency, 1 MiB bandwidth (16 in flight);
#   - libfabric 1.17: fi_pingpong -e msg, verbs provider vs tcp provider, 8 B latency and
#     1 MiB bandwidth, server in host a, client in host b.
# Hosts a and b are two network namespaces joined by a veth pair (198.18.251.0/24), each with
# one RoCE device `rxe_host` on its end (same names on both sides: ucx_perftest's server
# opens the device name its client sends). MTU=9000 sets the veth's MTU (default 1500, which
# gives RoCE a 1024-byte path MTU; 9000 gives 4096). Needs root; release build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-engines: needs root (it creates two network namespaces)" >&2; exit 1; }
for tool in ip ucx_perftest mpirun mpicc fi_pingpong python3; do
  command -v "$tool" >/dev/null || { echo "bench-engines: $tool is not installed (see the README's apt line)" >&2; exit 1; }
done
cargo build --release -q -p softrdma-cli
dropin=$(cargo xtask dropin 2>/dev/null | tail -1)
bin=$PWD/target/release/softrdma
work=$(mktemp -d)
A=srmbench$$a B=srmbench$$b IF=vbench ADDR_A=198.18.251.1 ADDR_B=198.18.251.2
cleanup() {
  jobs -p | xargs -r kill 2>/dev/null || true
  ip netns del "$A" 2>/dev/null || true
  ip netns del "$B" 2>/dev/null || true
  rm -rf "/etc/netns/$A" "$work"
}
trap cleanup EXIT
ip netns add "$A"
ip netns add "$B"
ip link add "$IF" netns "$A" type veth peer name "$IF" netns "$B"
ip -n "$A" addr add "$ADDR_A/24" dev "$IF"
ip -n "$B" addr add "$ADDR_B/24" dev "$IF"
for ns in "$A" "$B"; do
  ip -n "$ns" link set lo up
  ip -n "$ns" link set "$IF" mtu "${MTU:-1500}" up
done
for _ in $(seq 100); do
  ip -n "$A" link show "$IF" | grep -q LOWER_UP && ip -n "$B" link show "$IF" | grep -q LOWER_UP && break
  sleep 0.05
done
printf '[[device]]\nname = "rxe_host"\ntransport = "roce"\nnetdev = "%s"\n' "$IF" > "$work/devices.toml"
# fi_pingpong's server sends its client the address it bound, "localhost" (see the README)
mkdir -p "/etc/netns/$A"
echo "$ADDR_A localhost" > "/etc/netns/$A/hosts"
mpicc -O2 -Wall -o "$work/mpi_pingpong" tools/bench/mpi_pingpong.c

# `on_host NS CMD...` runs CMD in host NS under `softrdma run` (the devices are softrdma's);
# UCX and libfabric over TCP run the same way, which changes nothing for them.
on_host() {
  local ns=$1; shift
  SOFTRDMA_CONFIG=$work/devices.toml SOFTRDMA_DROPIN_DIR=$dropin timeout -k 5 120 ip netns exec "$ns" "$bin" run -- "$@"
}
wait_tcp() { # wait_tcp NS PORT: until something listens there (10 s at most)
  for _ in $(seq 200); do ip netns exec "$1" ss -ltnH "sport = :$2" | grep -q . && return 0; sleep 0.05; done
  echo "bench-engines: nothing listens on $2 in $1" >&2; return 1
}
# perftest PORT FIELD ARGS...: ucx_perftest server in a, client in b; prints field FIELD of
# "Final:" (4: average latency in µs, 7: overall bandwidth in MB/s)
perftest() {
  local port=$1 field=$2; shift 2
  on_host "$A" ucx_perftest -p "$port" "$@" >"$work/srv.log" 2>&1 &
  wait_tcp "$A" "$port"
  on_host "$B" ucx_perftest "$ADDR_A" -p "$port" "$@" 2>"$work/cli.err" | awk -v f="$field" '$1 == "Final:" { print $f }' \
    | grep . || { cat "$work/cli.err" "$work/srv.log" >&2; return 1; }
  wait
}
# pingpong PORT FIELD SIZE ITERS ARGS...: fi_pingpong -e msg, server in a, client in b;
# prints the row's field FIELD (6: MB/sec, 7: usec/xfer)
pingpong() {
  local port=$1 field=$2 size=$3 iters=$4; shift 4
  on_host "$A" fi_pingpong -e msg -S "$size" -I "$iters" -B "$port" "$@" >"$work/srv.log" 2>&1 &
  wait_tcp "$A" "$port"
  on_host "$B" fi_pingpong -e msg -S "$size" -I "$iters" -P "$port" "$@" "$ADDR_A" 2>"$work/cli.err" \
    | awk -v f="$field" '$1 ~ /^[0-9]/ { print $f }' | grep . || { cat "$work/cli.err" "$work/srv.log" >&2; return 1; }
  wait
}
# mpi PML-ARGS...: "lat_us bw_MBps" of tools/bench/mpi_pingpong.c, 2 ranks in host a
mpi() {
  on_host "$A" mpirun --allow-run-as-root -np 2 "$@" "$work/mpi_pingpong" 10000 50 2>"$work/mpi.err" \
    | awk '$1 == "lat_us" { l = $2 } $1 == "bw_MBps" { b = $2 } END { if (l == "" || b == "") exit 1; print l, b }' \
    || { cat "$work/mpi.err" >&2; return 1; }
}

RC=(-d rxe_host:1 -x rc_verbs)
TCP=(-d "$IF" -x tcp)
ucx_put_rc=$(perftest 20001 7 "${RC[@]}" -t put_bw -s 1048576 -D zcopy -n 2000)
ucx_put_tcp=$(perftest 20002 7 "${TCP[@]}" -t put_bw -s 1048576 -D zcopy -n 2000)
ucx_lat_rc=$(UCX_TLS=rc_verbs,ud_verbs UCX_NET_DEVICES=rxe_host:1 perftest 20003 4 -t tag_lat -s 8 -n 20000)
ucx_lat_tcp=$(UCX_TLS=tcp UCX_NET_DEVICES=$IF perftest 20004 4 -t tag_lat -s 8 -n 20000)
read -r mpi_lat_rc mpi_bw_rc < <(mpi --mca pml ucx --mca osc ucx --mca btl self \
  -x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=rxe_host:1)
read -r mpi_lat_tcp mpi_bw_tcp < <(mpi --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$IF")
fi_lat_rc=$(pingpong 20005 7 8 10000 -p verbs -d rxe_host)
fi_lat_tcp=$(pingpong 20006 7 8 10000 -p tcp)
fi_bw_rc=$(pingpong 20007 6 1048576 1000 -p verbs -d rxe_host)
fi_bw_tcp=$(pingpong 20008 6 1048576 1000 -p tcp)

python3 - "$ucx_put_rc" "$ucx_put_tcp" "$ucx_lat_rc" "$ucx_lat_tcp" "$mpi_lat_rc" "$mpi_lat_tcp" \
  "$mpi_bw_rc" "$mpi_bw_tcp" "$fi_lat_rc" "$fi_lat_tcp" "$fi_bw_rc" "$fi_bw_tcp" <<'PY'
import sys
v = list(map(float, sys.argv[1:]))
rows = [
    ("UCX put_bw 1 MiB (UCT rc_verbs / tcp, zcopy)", "MB/s", "higher"),
    ("UCX tag_lat 8 B (UCP rc_verbs,ud_verbs / tcp)", "µs", "lower"),
    ("Open MPI ping-pong 8 B (pml ucx / ob1+btl tcp)", "µs", "lower"),
    ("Open MPI bandwidth 1 MiB (pml ucx / ob1+btl tcp)", "MB/s", "higher"),
    ("libfabric fi_pingpong 8 B (verbs / tcp)", "µs", "lower"),
    ("libfabric fi_pingpong 1 MiB (verbs / tcp)", "MB/s", "higher"),
]
print("| what | softrdma (RoCE) | TCP | softrdma ÷ TCP | better |")
print("|---|---|---|---|---|")
for i, (what, unit, better) in enumerate(rows):
    s, t = v[2 * i], v[2 * i + 1]
    print(f"| {what} | {s:.2f} {unit} | {t:.2f} {unit} | {s / t:.2f} | {better} |")
PY
