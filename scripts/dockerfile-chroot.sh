#!/usr/bin/env bash
# `docker build` + `docker run` of the root Dockerfile where there is no docker daemon: each
# stage of the Dockerfile is a fresh Debian 12 root (debootstrap --variant=minbase bookworm,
# cached as a tarball), and its instructions are executed as written (FROM, RUN, ENV, COPY,
# COPY --from, WORKDIR, USER, CMD; anything else is an error, so the Dockerfile cannot grow a
# step this would silently skip). Then the image's CMD and every `docker run --rm softrdma ...`
# line of the README run in the final root as its unprivileged USER, in their own network, PID
# and mount namespaces (only `lo`, as in a container): Debian's unmodified rdma-core tools over
# softrdma.
#
# What differs from docker, and why:
#   - The RUN that installs Rust with rustup is not run: rustup's host is unreachable here and
#     Debian 12's rustc (1.63) is too old. The host's toolchain (`rustc --print sysroot`) is
#     bind-mounted read-only and linked into the stage's $CARGO_HOME/bin instead.
#   - Crates come from the host's cargo registry cache, bind-mounted read-only into the
#     stage's $CARGO_HOME/registry, with CARGO_NET_OFFLINE=true (no crates.io here either).
#   - Caches under $SOFTRDMA_CACHE (/var/cache/softrdma/dockerfile): the minbase tarball, the
#     downloaded .debs (/var/cache/apt/archives) and the release target directory of the
#     stage that builds (/src/target, like a BuildKit cache mount; .dockerignore keeps target/
#     out of the copied context). apt-get update runs every time (network needed).
#   - The build context is what git lists (tracked and untracked-but-not-ignored files), which
#     .dockerignore's entries (target, fuzz/target, .git, ...) are not part of either.
#   - The containers get a minimal /dev (null, zero, full, random, urandom, tty, shm), /proc of
#     their own PID namespace and a read-only /sys of their network namespace, as docker's.
#
# Usage: scripts/dockerfile-chroot.sh [DOCKERFILE]   (root; debootstrap, unshare, git)
# Every RUN and `docker run` is bounded by timeout(1); everything created lives in a temporary
# directory (removed at exit) and in mount namespaces that end with their processes.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
export PATH=$PATH:/usr/sbin:/sbin
DOCKERFILE=${1:-Dockerfile}
CACHE=${SOFTRDMA_CACHE:-/var/cache/softrdma/dockerfile}
SUITE=bookworm
MIRROR=${SOFTRDMA_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TARBALL=$CACHE/minbase-$SUITE.tar
RUN_TIMEOUT=${SOFTRDMA_DOCKERFILE_RUN_TIMEOUT:-1200}
DOCKER_RUN_TIMEOUT=60

die() { echo "dockerfile-chroot: $*" >&2; exit 1; }
say() { echo "==> $*"; }

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, chroot, namespaces)"
for tool in debootstrap unshare chroot git timeout tar ip; do
  command -v "$tool" >/dev/null || die "needs $tool"
done
[[ -f $DOCKERFILE ]] || die "no $DOCKERFILE"
mkdir -p "$CACHE/apt-archives/partial"

# 1. The base image: debootstrap once, then the tarball.
if [[ ! -s $TARBALL ]]; then
  say "debootstrap --variant=minbase $SUITE (once; cached in $TARBALL)"
  tmp=$(mktemp -d "$CACHE/debootstrap.XXXXXX")
  if ! timeout 900 debootstrap --variant=minbase "$SUITE" "$tmp/root" "$MIRROR" >"$tmp/log" 2>&1; then
    tail -20 "$tmp/log" >&2
    rm -rf "$tmp"
    die "debootstrap failed"
  fi
  tar -C "$tmp/root" -cf "$TARBALL.part" .
  mv "$TARBALL.part" "$TARBALL"
  rm -rf "$tmp"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/softrdma-dockerfile.XXXXXX")
cleanup() { rm -rf --one-file-system "$WORK"; }
trap cleanup EXIT
say "work directory: $WORK"

HOST_SYSROOT=$("${RUSTC:-rustc}" --print sysroot)
HOST_REGISTRY=${CARGO_HOME:-$HOME/.cargo}/registry

# The build context (COPY . DEST): git's view of the tree, as a tar stream.
context_tar() {
  git -C "$REPO" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' f; do [[ -e $REPO/$f || -L $REPO/$f ]] && printf '%s\0' "$f"; done |
    tar -C "$REPO" --null -T - -cf -
}

# Runs "$@" within `timeout SECONDS` in new mount and PID namespaces (plus EXTRA, e.g. --net)
# whose mounts the shell snippet MOUNTS sets up first. Everything in the PID namespace is
# killed when its first process ends (or the timeout kills it); the mounts end with it.
in_ns() { # seconds extra-unshare-flags mounts cmd...
  local secs=$1 flags=$2 mounts=$3
  shift 3
  # shellcheck disable=SC2086
  timeout -k 5 "$secs" unshare --mount --propagation private --pid --fork --kill-child $flags -- \
    bash -euc "$mounts"'
    exec "$@"' inside "$@"
}

# Mounts every RUN and container gets: /dev (minimal), /proc; the network-less run adds /sys.
base_mounts() { # root
  local r=$1
  cat <<EOF
mount -t tmpfs -o mode=755,nosuid tmpfs '$r/dev'
for n in null zero full random urandom tty; do touch '$r/dev/'\$n; mount --bind /dev/\$n '$r/dev/'\$n; done
mkdir -p '$r/dev/shm' '$r/dev/pts'; mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs '$r/dev/shm'
ln -s /proc/self/fd '$r/dev/fd'; ln -s /proc/self/fd/0 '$r/dev/stdin'; ln -s /proc/self/fd/1 '$r/dev/stdout'; ln -s /proc/self/fd/2 '$r/dev/stderr'
mount -t proc proc '$r/proc'
EOF
}

# The command line that runs `sh -c CMD` in root $1 as user $2 in directory $3 with the
# environment in the array ENVV.
chroot_cmd() { # root user dir -> prints nothing; sets CHROOT_ARGV
  local r=$1 user=$2 dir=$3
  CHROOT_ARGV=(chroot "$r")
  if [[ $user != root && $user != 0 ]]; then
    CHROOT_ARGV+=(setpriv "--reuid=$user" "--regid=$user" --init-groups --inh-caps=-all --bounding-set=-all --no-new-privs)
  fi
  CHROOT_ARGV+=(env -i "${ENVV[@]}")
  if [[ $user != root && $user != 0 ]]; then
    CHROOT_ARGV+=("HOME=/home/$user" "USER=$user")
  else
    CHROOT_ARGV+=(HOME=/root)
  fi
  CHROOT_ARGV+=(sh -c "cd '$dir' && exec \"\$0\" \"\$@\"")
}

# The instructions, one per element: comments dropped, continuation lines joined.
mapfile -t INSTR < <(awk '
  /^[[:space:]]*#/ && cont == "" { next }
  { line = cont $0 }
  /\\$/ { sub(/\\$/, "", line); cont = line; next }
  { cont = ""; if (line ~ /[^[:space:]]/) print line }' "$DOCKERFILE")

declare -A STAGE_ROOT
stage=-1
ROOT=""
ENVV=()
WORKDIR=/
USER_=root
CMD_JSON=""
RUST_SUBSTITUTED=0

env_get() { # name -> value from ENVV
  local kv
  for kv in "${ENVV[@]}"; do [[ ${kv%%=*} == "$1" ]] && { echo "${kv#*=}"; return; }; done
}
env_set() { # name value
  local i
  for i in "${!ENVV[@]}"; do
    if [[ ${ENVV[$i]%%=*} == "$1" ]]; then ENVV[$i]="$1=$2"; return; fi
  done
  ENVV+=("$1=$2")
}

run_in_stage() { # shell command
  local cmd=$1 mounts cargo_home
  mounts=$(base_mounts "$ROOT")
  mounts+=$'\n'"cp /etc/resolv.conf '$ROOT/etc/resolv.conf'"
  mounts+=$'\n'"mount --bind '$CACHE/apt-archives' '$ROOT/var/cache/apt/archives'"
  cargo_home=$(env_get CARGO_HOME)
  if [[ -n $cargo_home && -d $ROOT/opt/host-rust ]]; then
    mounts+=$'\n'"mount --bind -o ro '$HOST_SYSROOT' '$ROOT/opt/host-rust' && mount -o remount,bind,ro '$ROOT/opt/host-rust'"
    mkdir -p "$ROOT$cargo_home/registry"
    mounts+=$'\n'"mount --bind '$HOST_REGISTRY' '$ROOT$cargo_home/registry' && mount -o remount,bind,ro '$ROOT$cargo_home/registry'"
    mkdir -p "$CACHE/target" "$ROOT$WORKDIR/target"
    mounts+=$'\n'"mount --bind '$CACHE/target' '$ROOT$WORKDIR/target'"
  fi
  local envv_saved=("${ENVV[@]}")
  [[ -n $cargo_home ]] && ENVV+=(CARGO_NET_OFFLINE=true)
  ENVV+=(DEBIAN_FRONTEND=noninteractive)
  chroot_cmd "$ROOT" "$USER_" "$WORKDIR"
  ENVV=("${envv_saved[@]}")
  in_ns "$RUN_TIMEOUT" "" "$mounts" "${CHROOT_ARGV[@]}" sh -c "$cmd"
}

for line in "${INSTR[@]}"; do
  read -r op rest <<<"$line"
  case ${op^^} in
    FROM)
      read -r image as name <<<"$rest"
      [[ $image == debian:bookworm ]] || die "FROM $image: only debian:bookworm is reproduced here"
      stage=$((stage + 1))
      ROOT=$WORK/stage$stage
      mkdir -p "$ROOT"
      tar -C "$ROOT" -xf "$TARBALL"
      [[ ${as^^} == AS && -n $name ]] && STAGE_ROOT[$name]=$ROOT
      STAGE_ROOT[$stage]=$ROOT
      ENVV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
      WORKDIR=/
      USER_=root
      CMD_JSON=""
      say "FROM $rest (stage $stage: a fresh root from $TARBALL)"
      ;;
    ENV)
      # KEY=VALUE pairs (no quoting needed by this Dockerfile)
      for kv in $rest; do
        [[ $kv == *=* ]] || die "ENV $rest: only the KEY=VALUE form is supported"
        env_set "${kv%%=*}" "${kv#*=}"
      done
      say "ENV $rest"
      ;;
    WORKDIR)
      WORKDIR=$rest
      mkdir -p "$ROOT$WORKDIR"
      say "WORKDIR $rest"
      ;;
    USER)
      USER_=$rest
      say "USER $rest"
      ;;
    COPY)
      read -r a b c <<<"$rest"
      if [[ $a == --from=* ]]; then
        from=${STAGE_ROOT[${a#--from=}]:-}
        [[ -n $from ]] || die "COPY $rest: no stage ${a#--from=}"
        mkdir -p "$ROOT$c"
        cp -a "$from$b/." "$ROOT$c/"
      else
        [[ $a == . && -z $c ]] || die "COPY $rest: only 'COPY . DEST' and 'COPY --from=STAGE SRC DEST'"
        mkdir -p "$ROOT$b"
        context_tar | tar -C "$ROOT$b" -xf -
      fi
      say "COPY $rest"
      ;;
    RUN)
      if [[ $rest == *sh.rustup.rs* ]]; then
        cargo_home=$(env_get CARGO_HOME)
        [[ -n $cargo_home ]] || die "the rustup RUN needs CARGO_HOME set by an ENV before it"
        say "RUN $rest"
        say "   substituted: the host's toolchain, read-only ($HOST_SYSROOT, $("${RUSTC:-rustc}" --version)); crates from the host's registry cache, read-only, offline"
        mkdir -p "$ROOT/opt/host-rust" "$ROOT$cargo_home/bin"
        for t in cargo rustc rustdoc; do ln -sf "/opt/host-rust/bin/$t" "$ROOT$cargo_home/bin/$t"; done
        RUST_SUBSTITUTED=1
        continue
      fi
      say "RUN $rest"
      start=$SECONDS
      run_in_stage "$rest" || die "RUN failed: $rest"
      say "   done in $((SECONDS - start)) s"
      ;;
    CMD)
      CMD_JSON=$rest
      say "CMD $rest"
      ;;
    *)
      die "instruction $op is not reproduced by this script: $line"
      ;;
  esac
done
[[ $stage -ge 0 ]] || die "no FROM in $DOCKERFILE"
[[ -n $CMD_JSON ]] || die "the final stage has no CMD"

# 2. `docker run --rm softrdma [CMD...]`: the final root, its USER, only `lo`.
docker_run() { # argv...
  local mounts
  mounts=$(base_mounts "$ROOT")
  mounts+=$'\n'"mount -t sysfs -o ro sysfs '$ROOT/sys'"
  mounts+=$'\n'"ip link set lo up"
  chroot_cmd "$ROOT" "$USER_" "$WORKDIR"
  in_ns "$DOCKER_RUN_TIMEOUT" --net "$mounts" "${CHROOT_ARGV[@]}" "$@"
}

# The CMD's JSON array -> argv (strings without escapes, as this Dockerfile's).
mapfile -t CMD_ARGV < <(sed -e 's/^\[//' -e 's/\]$//' <<<"$CMD_JSON" | tr ',' '\n' | sed -e 's/^ *"//' -e 's/" *$//')
id_out=$(docker_run id -un)
[[ $id_out == "$USER_" ]] || die "the container runs as '$id_out', not '$USER_'"
[[ $(docker_run id -u) != 0 ]] || die "the container runs as root"
say "docker run --rm softrdma   (CMD ${CMD_ARGV[*]}, as $id_out, uid $(docker_run id -u), no capabilities)"
docker_run "${CMD_ARGV[@]}" || die "the image's CMD failed"

ran=0
while IFS= read -r readme_line; do
  args=${readme_line#docker run --rm softrdma}
  args=${args%%#*}
  [[ -z ${args// /} ]] && continue
  eval "set -- $args"
  say "docker run --rm softrdma$args"
  docker_run "$@" || die "failed: $readme_line"
  ran=$((ran + 1))
done < <(grep '^docker run --rm softrdma' "$REPO/README.md")
[[ $ran -gt 0 ]] || die "the README has no 'docker run --rm softrdma COMMAND' line to run"
say "dockerfile-chroot: OK ($((stage + 1)) stage(s) built, CMD and $ran README docker run line(s) passed as $USER_, rust substituted: $RUST_SUBSTITUTED)"
