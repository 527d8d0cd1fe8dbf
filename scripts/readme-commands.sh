#!/usr/bin/env bash
# Reads the README's setup from the README itself, so CI runs what a new user reads:
#   scripts/readme-commands.sh             the first two commands (the first ```sh block: the
#                                          demo, then the tests), one per line, without comments
#   scripts/readme-commands.sh --packages  the Debian packages of the README's apt-get line
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--packages" ]]; then
  line=$(grep -m1 '^sudo apt-get install ' README.md) || { echo "README.md has no 'sudo apt-get install' line" >&2; exit 1; }
  for word in ${line#sudo apt-get install }; do
    [[ $word == -* ]] || echo "$word"
  done
  exit 0
fi
awk '/^```sh$/ { inblock = 1; next }
     inblock && /^```$/ { exit }
     inblock { sub(/[[:space:]]+#.*$/, ""); if (length($0)) print }' README.md
