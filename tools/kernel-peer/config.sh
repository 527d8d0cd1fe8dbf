# Shared settings for the kernel-peer harness. Every value can be overridden from the
# environment (e.g. `KPEER_WORK=/var/tmp/kp ./vm.sh up`).
: "${KPEER_WORK:=/var/cache/softrdma/kpeer}"  # debs, staging, initramfs, logs, results (large; not in git; kept between CI runs)
: "${KPEER_RUN:=$KPEER_WORK/run}"       # one running guest: serial socket, console, pid file, results, drop-in copy
: "${KPEER_NS:=kpeer}"                   # network namespace that holds the tap and QEMU
: "${KPEER_TAP:=kptap0}"
: "${KPEER_HOST_IP:=198.18.99.1}"
: "${KPEER_GUEST_IP:=198.18.99.2}"
: "${KPEER_PREFIX:=24}"
: "${KPEER_HOST_IP6:=2001:2::1}"          # IPv6 cases (RFC 5180 benchmarking range), /64
: "${KPEER_GUEST_IP6:=2001:2::2}"
# The kernel: Debian's current bookworm kernel unless pinned. Debian's mirrors keep only the
# newest security build, so a pin goes stale; the default follows linux-image-amd64.
if [ -z "${KPEER_KVER:-}" ]; then
  KPEER_KVER=$(apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/.*Depends: linux-image-\(.*-amd64\)$/\1/p' | head -1)
  : "${KPEER_KVER:=6.1.0-57-amd64}"     # last known good (2026-12), if apt-cache knows nothing
fi
if [ -z "${KPEER_KPKGVER:-}" ]; then
  KPEER_KPKGVER=$(apt-cache policy "linux-image-$KPEER_KVER" 2>/dev/null | sed -n 's/.*Candidate: *//p' | head -1)
  [ -n "$KPEER_KPKGVER" ] && [ "$KPEER_KPKGVER" != "(none)" ] || KPEER_KPKGVER=6.1.192-3
fi
: "${KPEER_MEM:=1024}"
: "${KPEER_SMP:=2}"
: "${KPEER_ACCEL:=auto}"                 # auto | kvm | tcg
: "${KPEER_GUEST_DEV_SIW:=siw0}"
: "${KPEER_GUEST_DEV_RXE:=rxe0}"
# softrdma checkout and its drop-in directory (libibverbs.so.1 etc. -> libsoftrdma.so)
: "${SOFTRDMA_SRC:=$PWD}"               # run from the project root, or set this
: "${SOFTRDMA_DROPIN:=}"                 # empty: $KPEER_RUN/dropin, a copy of $SOFTRDMA_SRC/target/dropin (cargo xtask dropin)
KPEER_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
KPEER_SOCK="$KPEER_RUN/serial.sock"
KPEER_CONSOLE="$KPEER_RUN/console.log"
KPEER_PIDFILE="$KPEER_RUN/qemu.pid"
mkdir -p "$KPEER_RUN" 2>/dev/null || true
# the image of one kernel build (a new Debian kernel gets its own; the .debs are shared)
KPEER_IMG="$KPEER_WORK/image-$KPEER_KVER-$KPEER_KPKGVER"
KPEER_INITRD="$KPEER_IMG/initramfs.cpio.gz"
KPEER_KERNEL="$KPEER_IMG/vmlinuz"
export KPEER_WORK KPEER_RUN KPEER_NS KPEER_TAP KPEER_HOST_IP KPEER_GUEST_IP KPEER_HOST_IP6 KPEER_GUEST_IP6 KPEER_PREFIX KPEER_KVER \
  KPEER_KPKGVER KPEER_MEM KPEER_SMP KPEER_ACCEL KPEER_GUEST_DEV_SIW KPEER_GUEST_DEV_RXE \
  SOFTRDMA_SRC SOFTRDMA_DROPIN KPEER_DIR KPEER_SOCK KPEER_CONSOLE KPEER_PIDFILE KPEER_IMG KPEER_INITRD KPEER_KERNEL

dropin_dir() {
  if [ -n "$SOFTRDMA_DROPIN" ]; then echo "$SOFTRDMA_DROPIN"; return; fi
  local d="$KPEER_RUN/dropin" so="$SOFTRDMA_SRC/target/dropin/libsoftrdma.so"
  [ -e "$so" ] || so="$SOFTRDMA_SRC/target/release/libsoftrdma.so"
  if [ ! -e "$d/libsoftrdma.so" ] || [ "$so" -nt "$d/libsoftrdma.so" ]; then
    [ -e "$so" ] || { echo "no $so: build softrdma (cargo xtask dropin) or set SOFTRDMA_DROPIN" >&2; return 1; }
    mkdir -p "$d"
    cp -f "$so" "$d/libsoftrdma.so"   # a copy: a rebuild under us must not change the running library
    for l in libibverbs.so.1 librdmacm.so.1 libmlx5.so.1 libefa.so.1; do ln -sf libsoftrdma.so "$d/$l"; done
  fi
  echo "$d"
}
