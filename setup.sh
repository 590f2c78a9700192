#!/usr/bin/env bash
# Install everything dedal and its test suite use, on a fresh Debian (bookworm) machine.
# Idempotent: re-running skips what is already there. Needs root (apt) or sudo.
#   ./setup.sh            system packages, siftool, gitlab-ci-local, .venv with dedal[test]
#   DEDAL_APPTAINER_SRC=GITDIR ./setup.sh
#                         also builds Apptainer (no Debian package exists) from GITDIR, a git
#                         checkout of github.com/apptainer/apptainer (its newest vX.Y.Z tag, or
#                         DEDAL_APPTAINER_REF), into DEDAL_APPTAINER_PREFIX (default /opt/apptainer),
#                         linked as /usr/local/bin/apptainer; skipped when that version is there
# Tools land in ~/.cache/dedal/bin (siftool) and /usr/local/bin (dedal, gitlab-ci-local); bash
# completion in /usr/share/bash-completion/completions/dedal.
# Quiet: one line per step; the tools' own output goes to ~/.cache/dedal/setup.log and is shown
# only when a step fails.
set -euo pipefail
cd "$(dirname "$0")"
REPO=$(pwd)
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
CACHE=${DEDAL_CACHE_DIR:-$HOME/.cache/dedal}
# toolchains installed outside the Debian packages (e.g. Go in /usr/local/go)
for d in /usr/local/go/bin "$HOME/go/bin"; do
  [ -d "$d" ] && case ":$PATH:" in *":$d:"*) ;; *) PATH="$d:$PATH" ;; esac
done
export PATH
BIN=$CACHE/bin
mkdir -p "$BIN"
LOG=$CACHE/setup.log
: >"$LOG"

# run a step with its output in the log; on failure, show the log's end and stop. On a terminal
# a line shows the step's elapsed time and the log's latest line, so no step is silent for long:
# its latest unindented line, as an indented one is a part (a warning's source line, a traceback's)
# that reads as an error out of its context. There the step runs in a process group of its own
# (set -m): bash without job control starts a background command with SIGINT ignored, so a
# Ctrl-C ended setup and left apt-get or pip running behind the prompt. A stop is passed on to
# the step's group instead, and setup ends when the step has.
quietly() {
  local rc=0 start=$SECONDS pid last stopped=""
  if [ -t 1 ]; then
    set -m
    "$@" >>"$LOG" 2>&1 </dev/null &
    pid=$!
    set +m
    trap 'stopped=INT; kill -INT -- "-$pid" 2>/dev/null || true' INT
    trap 'stopped=TERM; kill -TERM -- "-$pid" 2>/dev/null || true' TERM HUP
    while kill -0 "$pid" 2>/dev/null; do
      # a Ctrl-C ends these too, with 130: under `set -e` that ended setup before the step
      last=$( (grep -v '^[[:space:]]' "$LOG" || true) | tail -n 1 | tr -d '\r\t' | cut -c1-70) || last=""
      printf '\r\033[K  %3ds  %s' "$((SECONDS - start))" "$last"
      sleep 1 || true
    done
    wait "$pid" || rc=$?
    trap - INT TERM HUP
    printf '\r\033[K'
  else
    "$@" >>"$LOG" 2>&1 </dev/null || rc=$?
  fi
  if [ -n "$stopped" ]; then
    echo "setup: interrupted by SIG$stopped during: $*; the log: $LOG" >&2
    [ "$stopped" = INT ] && exit 130
    exit 143
  fi
  if [ "$rc" != 0 ]; then
    echo "setup: failed (exit $rc): $*" >&2
    tail -n 40 "$LOG" >&2
    echo "setup: the whole log: $LOG" >&2
    exit 1
  fi
}

# apt-get, waiting while another package manager holds apt's lock (unattended-upgrades starts on a
# machine just booted, which is where the README's first command is typed): a try that the lock
# stopped changed nothing, so it is tried again every APT_LOCK_POLL seconds, up to APT_LOCK_WAIT.
# (`apt-get update` ignores DPkg::Lock::Timeout, so one loop serves update and install.)
APT_LOCK_WAIT=${APT_LOCK_WAIT:-600}
APT_LOCK_POLL=${APT_LOCK_POLL:-5}
apt_get() {
  local out rc waited=0
  out=$(mktemp)
  while :; do
    rc=0
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get "$@" 2>&1 | tee "$out" || rc=$?
    if [ "$rc" = 0 ] || ! grep -q "Could not get lock" "$out" || [ "$waited" -ge "$APT_LOCK_WAIT" ]; then
      rm -f "$out"
      return "$rc"
    fi
    echo "Waiting for another package manager to release apt's lock (${waited}s of ${APT_LOCK_WAIT}s)"
    sleep "$APT_LOCK_POLL"
    waited=$((waited + APT_LOCK_POLL))
  done
}
# sudo asks for a password here, in the foreground, not inside a step whose output is logged
[ -z "$SUDO" ] || sudo -v

APT_PACKAGES=(
  python3 python3-venv python3-pip git ca-certificates curl rsync zstd file
  build-essential gcc g++ make golang-go nodejs npm
  squashfs-tools squashfs-tools-ng squashfuse fuse3 fuse-overlayfs bubblewrap util-linux iproute2
  debootstrap debian-archive-keyring charliecloud-runtime bash-completion
  slurm-wlm slurmctld slurmd slurm-client munge libpmix-dev
  docker-registry apache2-utils
)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  # tools that the machine already has from elsewhere (Go, Node, Python) count as present
  case $p in
    golang-go) command -v go >/dev/null && continue ;;
    nodejs|npm) command -v node >/dev/null && command -v npm >/dev/null && continue ;;
    python3|python3-venv|python3-pip) command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null && continue ;;
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  quietly apt_get update -q
  quietly apt_get install -y -q --no-install-recommends "${missing[@]}"
fi

# siftool (sylabs/sif: same SIF format and object layout that `apptainer build` writes)
if [ ! -x "$BIN/siftool" ]; then
  echo "setup: building siftool"
  quietly env GOPATH="$CACHE/go" GOBIN="$BIN" GOFLAGS=-modcacherw go install github.com/sylabs/sif/v2/cmd/siftool@v2.24.2
fi

# Apptainer (optional, only with DEDAL_APPTAINER_SRC): a non-setuid build from source, the
# way ../shared/tools/build-apptainer.sh does it (that script is used when present: it also
# installs the Debian build dependencies and keeps Go's build cache apart). Only Go modules
# and Debian packages are downloaded, here and never at test time.
if [ -n "${DEDAL_APPTAINER_SRC:-}" ]; then
  prefix=${DEDAL_APPTAINER_PREFIX:-/opt/apptainer}
  src=$DEDAL_APPTAINER_SRC
  ref=${DEDAL_APPTAINER_REF:-$(git -C "$src" tag --list 'v[0-9]*' | grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | sort -V | tail -1)}
  builder=${DEDAL_APPTAINER_BUILDER:-$REPO/../shared/tools/build-apptainer.sh}
  if [ "$("$prefix/bin/apptainer" --version 2>/dev/null)" = "apptainer version ${ref#v}" ]; then
    echo "setup: apptainer ${ref#v} already in $prefix"
  elif [ -x "$builder" ]; then
    echo "setup: building apptainer $ref with $builder (minutes; log: $LOG)"
    quietly $SUDO "$builder" "$src" "$prefix" "$ref"
  else
    echo "setup: building apptainer $ref from $src into $prefix (minutes; log: $LOG)"
    quietly apt_get install -y -q --no-install-recommends \
      libseccomp-dev libtalloc-dev libattr1-dev libprotobuf-c-dev libsubid-dev uidmap fakeroot cryptsetup \
      libfuse3-dev fuse2fs pkg-config tzdata
    work=$CACHE/apptainer-build
    rm -rf "$work" && quietly git clone -q "$src" "$work" && quietly git -C "$work" checkout -q "$ref"
    # the Makefile runs `go clean -cache`: its own build cache keeps the user's
    quietly sh -c "cd '$work' && export GOCACHE='$work/.gocache' && ./mconfig --without-suid -b builddir -p '$prefix' \
      && make -C builddir -j$(nproc) && $SUDO make -C builddir install"
    rm -rf "$work"
  fi
  if [ -w /usr/local/bin ] || [ -n "$SUDO" ]; then
    $SUDO ln -sf "$prefix/bin/apptainer" /usr/local/bin/apptainer
  fi
fi

# gitlab-ci-local: 4.73.0 is the newest that runs on Node 20
if ! command -v gitlab-ci-local >/dev/null || [ "$(gitlab-ci-local --version 2>/dev/null)" != "4.73.0" ]; then
  echo "setup: installing gitlab-ci-local 4.73.0"
  quietly $SUDO npm install -g --no-fund --no-audit gitlab-ci-local@4.73.0
fi

# Python package in a virtual environment inside the checkout
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  quietly "$PY" -m venv .venv
fi
stamp=.venv/.dedal-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing dedal into .venv"
  quietly .venv/bin/python -m pip install -q --upgrade pip
  quietly .venv/bin/python -m pip install -q -e ".[test]"
  touch "$stamp"
fi
# dedal and siftool on PATH for the README commands
if [ -w /usr/local/bin ] || [ -n "$SUDO" ]; then
  $SUDO ln -sf "$REPO/.venv/bin/dedal" /usr/local/bin/dedal
  $SUDO ln -sf "$BIN/siftool" /usr/local/bin/siftool
fi
# bash completion, loaded by bash-completion in every new shell (`source <(dedal completion bash)` in this one)
completions=/usr/share/bash-completion/completions
if [ -d "$completions" ] && { [ -w "$completions" ] || [ -n "$SUDO" ]; }; then
  .venv/bin/dedal completion bash | $SUDO tee "$completions/dedal" >/dev/null
fi
echo "setup: ok ($(.venv/bin/dedal --version 2>/dev/null || echo "dedal not runnable"))"
