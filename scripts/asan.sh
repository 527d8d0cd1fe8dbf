#!/usr/bin/env bash
# Memory-safety checks with AddressSanitizer (+ LeakSanitizer) on the stable toolchain.
#
#   scripts/asan.sh tests [-- TEST-ARGS...]   the workspace tests, instrumented
#   scripts/asan.sh tools [-- TEST-ARGS...]   the Debian tools over an ASan build of the drop-in library
#   scripts/asan.sh [all]                     both (what CI runs)
#
# tests: RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes" (the same
#   RUSTDOCFLAGS for the doctests) cargo test --workspace --exclude softrdma-capi --target <host>
#   --no-fail-fast, then `--workspace --lib` (adds the C ABI's unit tests). The
#   explicit --target keeps build scripts and proc macros uninstrumented; the target directory
#   is $CARGO_TARGET_DIR/asan (default target/asan), so the normal build stays valid. The capi
#   integration tests run C programs that load the library: they are the `tools` part.
# tools: `cargo xtask dropin --asan` (the same instrumented build, into target/dropin-asan/),
#   then the capi integration tests cm_tools (ucmatose, rping, rping -q, rdma_server/client,
#   cmtime), roce_tools (ibv_rc_pingpong / ibv_ud_pingpong -g 0, ib_{send,write,read}_{bw,lat}
#   on rxe_lo) and dropin (ibv_devices, ibv_devinfo, the C smoke programs, built with
#   -fsanitize=address too) against it; limits skips its object counts there
#   (SOFTRDMA_LIMITS_COUNTS=0: 700,000 objects take minutes under ASan).
#   The test executables are built without ASan (in
#   target/asan/debug/, with their own CARGO_TARGET_TMPDIR, so a concurrent normal `cargo test`
#   never picks up the ASan library); they get SOFTRDMA_DROPIN_LIB=<the ASan library> and
#   LD_PRELOAD=<an ASan runtime> and pass both on to every program they start. rustc links the
#   ASan runtime into executables only, not into a cdylib, so the uninstrumented C programs need
#   one preloaded: GCC's (`gcc -print-file-name=libasan.so`, Debian libasan8) serves the LLVM
#   instrumentation (same v8 ABI); ASAN_RUNTIME=/path/libasan.so overrides.
#   LeakSanitizer is off only for the runs in which a Debian tool leaks by itself (perftest
#   always, ibv_rc_pingpong / ibv_ud_pingpong on their error exits): those leaks include what the
#   library allocated for the tool (the device list, MRs) and the tool never gives back.
#
# Every sanitized process writes its report to $CARGO_TARGET_DIR/asan/logs/<run>/<part>/asan.<pid>
# (ASAN_OPTIONS log_path), so a report is caught even from a server that is killed
# or exits mid-report, or from a child whose failure a test expects. The script fails if a test
# fails or any report exists, and prints the reports symbolized (llvm-symbolizer, else
# addr2line). ASAN_OPTIONS / LSAN_OPTIONS from the environment are appended (they win).
# Runs under `nice -n 10`; needs what `cargo test` needs (root for the namespace tests), gcc's
# libasan for `tools`, python3 and llvm-symbolizer (Debian: llvm) or addr2line for the reports.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

mode=${1:-all}
shift || true
if [ "${1:-}" = "--" ]; then shift; fi
test_args=("$@")
case $mode in
  tests | tools | all) ;;
  -h | --help) sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "asan.sh: unknown mode '$mode' (tests, tools, all)" >&2; exit 2 ;;
esac

TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
case $TARGET_DIR in /*) ;; *) TARGET_DIR=$ROOT/$TARGET_DIR ;; esac
ASAN_DIR=$TARGET_DIR/asan
TRIPLE=$(rustc -vV | sed -n 's/^host: //p')
FLAGS="-Zsanitizer=address -Cforce-frame-pointers=yes"
RUN=$ASAN_DIR/logs/$(date +%Y%m%d-%H%M%S)-$$
mkdir -p "$ASAN_DIR"

# LeakSanitizer suppressions: deliberate leaks only.
SUPP=$ASAN_DIR/lsan.supp
cat >"$SUPP" <<'EOF'
# crates/wire/tests/roce_golden.rs check_good(): `transport.to_vec().leak()` makes the
# RocePacket<'static> it returns (test code, on purpose).
leak:roce_golden::check_good
EOF

USER_ASAN_OPTIONS=${ASAN_OPTIONS:-}
export LSAN_OPTIONS="suppressions=$SUPP:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
export RUST_BACKTRACE=${RUST_BACKTRACE:-1}

# Sets ASAN_OPTIONS for what follows: reports go to $RUN/$1; $2 is detect_leaks, $3 symbolize.
# detect_leaks=1: LeakSanitizer at exit. It suspends threads with ptrace; where a sandbox
#   forbids that it fails loudly ("LeakSanitizer has encountered a fatal error"): rerun with
#   ASAN_OPTIONS=detect_leaks=0.
# quarantine_size_mb=8: freed memory is held back 8 MB deep (default 256), enough for the
#   use-after-free of recent frees; with 256 MB the tests that bound RSS growth (cm_leaks, the
#   soak runs of faults.rs) exceed their bounds.
# symbolize=0 (tools): the report is written at once, so a C tool whose main thread exits (or
#   a server the test kills) while another thread reports still leaves a complete report;
#   check_reports symbolizes it (GCC's runtime would not demangle Rust names anyway).
#   symbolize=1 (tests): LSan suppressions match function names, which needs symbols.
asan_options() {
  LOGS=$RUN/$1
  mkdir -p "$LOGS"
  export ASAN_OPTIONS="detect_leaks=$2:quarantine_size_mb=8:symbolize=$3:log_path=$LOGS/asan${USER_ASAN_OPTIONS:+:$USER_ASAN_OPTIONS}"
}

# Prints a command (shell-quoted), then runs it.
run() {
  printf '+'
  printf ' %q' "$@"
  printf '\n'
  "$@"
}

# Resolves the "(module+0xoffset)" frames of a report (stdin) to function and file:line.
symbolize() {
  python3 -c '
import re, shutil, subprocess, sys
lines = sys.stdin.read().splitlines()
frame = re.compile(r"^(\s*#(\d+) 0x[0-9a-f]+)\s+\((/[^+()]+)\+(0x[0-9a-f]+)\)( \(BuildId: [0-9a-f]+\))?\s*$")
def key(m):  # frames above #0 are return addresses: look up the call instruction
    return m.group(3), hex(int(m.group(4), 16) - (m.group(2) != "0"))
want = {}
for l in lines:
    m = frame.match(l)
    if m:
        want.setdefault(m.group(3), set()).add(key(m)[1])
resolved = {}
llvm = shutil.which("llvm-symbolizer")
for mod, offs in want.items():
    offs = sorted(offs)
    try:
        if llvm:
            out = subprocess.run([llvm, "--obj=" + mod, "--demangle", "--inlining=false"],
                                 input="\n".join(offs) + "\n", capture_output=True, text=True, timeout=300).stdout
            blocks = [b.splitlines() for b in out.strip("\n").split("\n\n")]
        else:
            out = subprocess.run(["addr2line", "-f", "-C", "-e", mod] + offs,
                                 capture_output=True, text=True, timeout=300).stdout.splitlines()
            blocks = [out[i:i + 2] for i in range(0, len(out), 2)]
    except Exception:
        continue
    for off, b in zip(offs, blocks):
        if len(b) >= 2 and b[0] not in ("??", ""):
            resolved[(mod, off)] = "in %s %s" % (b[0], b[1])
for l in lines:
    m = frame.match(l)
    r = m and resolved.get(key(m))
    print("%s %s (%s+%s)" % (m.group(1), r, m.group(3), m.group(4)) if r else l)
'
}

failed=()

# Prints the reports in $LOGS (symbolized); non-zero if there are any.
check_reports() {
  local what=$1 files f
  files=$(find "$LOGS" -type f -name 'asan.*' 2>/dev/null | sort)
  if [ -z "$files" ]; then
    echo "=== asan.sh $what: no sanitizer reports"
    return 0
  fi
  echo "=== asan.sh $what: $(echo "$files" | wc -l) sanitizer report(s) in $LOGS:" >&2
  for f in $files; do
    echo "--- $f" >&2
    symbolize <"$f" >"$f.txt" 2>&1 || cp "$f" "$f.txt"
    cat "$f.txt" >&2
  done
  return 1
}

tests() {
  local t0=$SECONDS rc=0
  echo "=== asan.sh tests: workspace tests under AddressSanitizer ($TRIPLE)"
  asan_options tests 1 1
  local env=(env -u CARGO_ENCODED_RUSTFLAGS -u CARGO_ENCODED_RUSTDOCFLAGS RUSTC_BOOTSTRAP=1
    "RUSTFLAGS=$FLAGS" "RUSTDOCFLAGS=$FLAGS" "CARGO_TARGET_DIR=$ASAN_DIR"
    # The 2 % loss transfers' 1 GiB and the 60 s soak are the plain run's figures; 64 MiB and
    # 20 s exercise the same paths here (and keep CI within its 30 minutes).
    "SOFTRDMA_LOSS_TEST_MIB=${SOFTRDMA_LOSS_TEST_MIB:-64}" "SOFTRDMA_SOAK_SECS=${SOFTRDMA_SOAK_SECS:-20}")
  # dockerfile_chroot builds and runs the Dockerfile's own (release, uninstrumented) image, and
  # xtask's cargo_package builds every crate from its .crate with the plain flags: nothing of
  # either runs under ASan, so they run once, in the plain test pass (together 4 minutes)
  run "${env[@]}" nice -n 10 cargo test --workspace --exclude softrdma-capi --target "$TRIPLE" --no-fail-fast -- \
    --skip dockerfile_builds_and_runs_in_a_clean_debian12_root \
    --skip every_crate_packages_and_builds_from_its_archive "${test_args[@]}" || rc=1
  # The capi unit tests: `--workspace --lib` (it reruns the other unit tests, ~10 s), not
  # `-p softrdma-capi`, which unifies dependency features differently and rebuilds them all.
  run "${env[@]}" nice -n 10 cargo test --workspace --lib --target "$TRIPLE" --no-fail-fast -- "${test_args[@]}" || rc=1
  [ $rc -eq 0 ] || echo "asan.sh tests: cargo test failed" >&2
  check_reports tests || rc=1
  echo "=== asan.sh tests: $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed+=(tests)
}

tools() {
  local t0=$SECONDS rc=0
  echo "=== asan.sh tools: the Debian tools over the ASan drop-in library"
  local runtime=${ASAN_RUNTIME:-$(gcc -print-file-name=libasan.so 2>/dev/null)}
  if [ ! -e "$runtime" ]; then
    echo "asan.sh: no ASan runtime to preload ('gcc -print-file-name=libasan.so' gave '$runtime'); install gcc + libasan8 or set ASAN_RUNTIME" >&2
    failed+=(tools)
    return
  fi
  runtime=$(readlink -f "$runtime")
  local plain=(env -u RUSTFLAGS -u RUSTDOCFLAGS -u RUSTC_BOOTSTRAP -u CARGO_ENCODED_RUSTFLAGS -u ASAN_OPTIONS)
  local dir
  echo "+ cargo xtask dropin --asan"
  dir=$("${plain[@]}" nice -n 10 cargo xtask dropin --asan | tail -1)
  if [ -z "$dir" ] || [ ! -f "$dir/libsoftrdma.so" ]; then
    echo "asan.sh: cargo xtask dropin --asan failed" >&2
    failed+=(tools)
    return
  fi
  # The test executables: uninstrumented, in their own target directory.
  local json
  echo "+ CARGO_TARGET_DIR=$ASAN_DIR cargo test -p softrdma-capi --test cm_tools --test roce_tools --test dropin --no-run"
  json=$("${plain[@]}" "CARGO_TARGET_DIR=$ASAN_DIR" nice -n 10 cargo test -p softrdma-capi \
    --test cm_tools --test roce_tools --test dropin --no-run --message-format=json-render-diagnostics) || json=
  exe() {
    python3 -c '
import json, sys
for l in sys.stdin:
    try:
        m = json.loads(l)
    except ValueError:
        continue
    if m.get("executable") and m["target"]["name"] == sys.argv[1]:
        print(m["executable"])' "$1" <<<"$json" | tail -1
  }
  local cm roce dropin
  cm=$(exe cm_tools) roce=$(exe roce_tools) dropin=$(exe dropin)
  if [ -z "$cm" ] || [ -z "$roce" ] || [ -z "$dropin" ]; then
    echo "asan.sh: building the capi integration tests failed" >&2
    failed+=(tools)
    return
  fi
  # The C smoke programs are compiled with -fsanitize=address (which also resolves the library's
  # __asan_* references at link time); the compiler itself runs without the preloaded runtime.
  local cc=$ASAN_DIR/cc-asan
  printf '#!/bin/sh\nunset LD_PRELOAD\nexec %s -fsanitize=address -fno-omit-frame-pointer -g "$@"\n' "${CC:-cc}" >"$cc"
  chmod +x "$cc"
  # One run of a test executable: LEAKS (1/0), the executable, its arguments.
  capi() {
    local leaks=$1
    shift
    asan_options tools "$leaks" 0
    (cd crates/capi && run env "LD_PRELOAD=$runtime" "SOFTRDMA_DROPIN_LIB=$dir/libsoftrdma.so" "CC=$cc" \
      "ASAN_OPTIONS=$ASAN_OPTIONS" "SOFTRDMA_LIMITS_COUNTS=0" \
      nice -n 10 "$@" "${test_args[@]}") || rc=1
  }
  local leaky_roce=(ibv_rc_pingpong_without_gid_says_what_to_do perftest_without_rdma_cm_over_rxe)
  local leaky_dropin=(refused_paths_fail_cleanly_in_the_binaries)
  capi 1 "$cm"
  capi 1 "$roce" "${leaky_roce[@]/#/--skip=}"
  capi 0 "$roce" --exact "${leaky_roce[@]}"
  capi 1 "$dropin" "${leaky_dropin[@]/#/--skip=}"
  capi 0 "$dropin" --exact "${leaky_dropin[@]}"
  [ $rc -eq 0 ] || echo "asan.sh tools: a test failed" >&2
  check_reports tools || rc=1
  echo "=== asan.sh tools: $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed+=(tools)
}

case $mode in
  tests) tests ;;
  tools) tools ;;
  all) tests; tools ;;
esac

if [ ${#failed[@]} -gt 0 ]; then
  echo "asan.sh: FAILED: ${failed[*]} (reports: $RUN)" >&2
  exit 1
fi
find "$RUN" -type d -empty -delete 2>/dev/null
echo "asan.sh: OK ($mode)"
