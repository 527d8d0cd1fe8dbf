#!/usr/bin/env bash
# Builds and runs every cargo-fuzz target in fuzz/ for SECONDS each (default 30); this is what
# CI runs. Exits non-zero if any target finds a crash (panic, failed invariant, ASan report,
# timeout or OOM); the reproducer is in fuzz/artifacts/<target>/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#
# Targets: wire_decoders, mpa_handshake, iwarp_rx_stream, roce_rx, cm_mad (all when none is named).
# Needs cargo-fuzz (`cargo install cargo-fuzz`). cargo-fuzz uses nightly -Z flags; on a stable
# toolchain this script sets RUSTC_BOOTSTRAP=1. Everything runs under `nice -n 19` with one
# libFuzzer job (-jobs=1 -workers=1), so it can share a machine with a build.
#
# New inputs go to a scratch corpus (fuzz/target/scratch-corpus/<target>); the committed
# corpus fuzz/corpus/<target> and the seeds fuzz/seeds/*/<target> are only read. With
# FUZZ_UPDATE_CORPUS=1 the scratch finds are merged into fuzz/corpus/<target>, which is then
# minimised with `cargo fuzz cmin` (how the committed corpora were made:
# `FUZZ_UPDATE_CORPUS=1 scripts/fuzz.sh 600` is the 10-minute-per-target campaign).
#
# Reproduce a crash:  cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run <target> artifacts/<target>/<crash-file>
set -uo pipefail
cd "$(dirname "$0")/../fuzz"

duration=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(wire_decoders mpa_handshake iwarp_rx_stream roce_rx cm_mad)
case $duration in '' | *[!0-9]*) echo "fuzz.sh: SECONDS must be a number, got '$duration'" >&2; exit 2 ;; esac

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz.sh: cargo-fuzz is not installed; run: cargo install cargo-fuzz" >&2
  exit 2
fi
export RUSTC_BOOTSTRAP=1

# Prints a command exactly (shell-quoted), then runs it.
run() {
  printf '+ RUSTC_BOOTSTRAP=1'
  printf ' %q' "$@"
  printf '   (in %s)\n' "$PWD"
  "$@"
}

run nice -n 19 cargo fuzz build || { echo "fuzz.sh: build failed" >&2; exit 2; }

failed=()
summary=()
for t in "${targets[@]}"; do
  scratch=target/scratch-corpus/$t
  mkdir -p "$scratch" "corpus/$t" "artifacts/$t"
  dirs=("$scratch" "corpus/$t")
  for s in seeds/captures/$t seeds/generated/$t; do [ -d "$s" ] && dirs+=("$s"); done
  before=$(find "artifacts/$t" -type f | wc -l)
  stamp=$(mktemp)
  echo
  echo "=== $t: ${duration}s"
  run nice -n 19 cargo fuzz run "$t" "${dirs[@]}" -- \
    -max_total_time="$duration" -jobs=1 -workers=1 -timeout=25 -rss_limit_mb=2048 -print_final_stats=1
  rc=$?
  log=fuzz-0.log
  after=$(find "artifacts/$t" -type f | wc -l)
  stats=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" 2>/dev/null | tail -1)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" 2>/dev/null | tail -1)
  if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ] || grep -qE '^==[0-9]+==ERROR|^SUMMARY: libFuzzer' "$log" 2>/dev/null; then
    failed+=("$t")
    summary+=("$t: CRASH (exit $rc); new artifacts: $(find "artifacts/$t" -type f -newer "$stamp" | tr '\n' ' ')")
    grep -E 'panicked at|^==[0-9]+==ERROR|^SUMMARY' "$log" 2>/dev/null | head -5
  else
    summary+=("$t: ok, ${execs:-?} execs; ${stats:-no stats}")
  fi
  rm -f "$stamp"
  if [ "${FUZZ_UPDATE_CORPUS:-0}" = 1 ] && [ "$rc" -eq 0 ]; then
    find "$scratch" -type f -exec cp {} "corpus/$t/" \;
    run nice -n 19 cargo fuzz cmin "$t" "corpus/$t" -- -rss_limit_mb=2048 -timeout=25
    echo "corpus/$t: $(find "corpus/$t" -type f | wc -l) files after cmin"
  fi
done

echo
echo "=== fuzz.sh summary (${duration}s per target)"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: crashes in: ${failed[*]} (reproducers in fuzz/artifacts/<target>/)" >&2
  exit 1
fi
