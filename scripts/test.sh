#!/usr/bin/env bash
# The tests: `cargo test --workspace` (extra arguments are passed on), then the list of what
# did not run and why, counted. A test that cannot run here (no root, a missing tool, no
# kernel-peer guest image) is reported by cargo as ignored with its reason; this gathers them
# from every test binary so they are not lost in the output. Exits with cargo's status.
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
awk '
  /^ *Running / { bin = $2; sub(/^.*\//, "", bin); sub(/\.rs$/, "", bin) }
  /^ *Doc-tests / { bin = "doctests " $2 }
  # libtest: "test NAME ... ignored, REASON"
  /^test .* \.\.\. ignored, / { name = $2; r = $0; sub(/^.* \.\.\. ignored, /, "", r); n++; out[n] = bin "::" name ": " r; next }
  # harnesses that print "<bin>: NAME ignored: REASON" and then "test NAME ... ignored"
  /^[A-Za-z_]+: all [0-9]+ cases ignored: / { r = $0; sub(/^[^:]*: all [0-9]+ cases ignored: /, "", r); all_why[bin] = r; next }
  /^[A-Za-z_]+: [^ ]+ ignored: / { nm = $2; r = $0; sub(/^[^:]*: [^ ]* ignored: /, "", r); why[nm] = r; next }
  /^test .* \.\.\. ignored$/ { name = $2; r = (name in why) ? why[name] : ((bin in all_why) ? all_why[bin] : "(no reason given)"); n++; out[n] = bin "::" name ": " r; next }
  END {
    print ""
    if (n == 0) { print "==> every test ran (none ignored)"; exit }
    print "==> not run: " n " test(s), each with the reason it gave"
    for (i = 1; i <= n; i++) print "  " out[i]
  }' "$log"
exit "$rc"
