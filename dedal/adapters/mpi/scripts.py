"""The shell that runs on the nodes of an MPI step: the rank script (:data:`RANK_SCRIPT`: one
rank's sandbox, started with the rank's ``PMIX_``/``PMI_``/``SLURM_`` variables on its standard
input, the image mounted where the node lacks the caller's mount), the loader in front of the
program inside (:func:`rank_command`), the holder of a node's Apptainer instance
(:data:`INSTANCE_SCRIPT`) and the reaper of what a step left running (:data:`REAP_SCRIPT`).
Why each is as it is: :mod:`dedal.adapters.mpi`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Sequence

from dedal.model.artifacts import write_atomic


#: variables of a rank that the launcher sets and the program needs inside the sandbox
RANK_PREFIXES = ("PMIX", "PMI", "SLURM")


IMAGE_TOKEN = "@DEDAL_IMAGE@"


RANK_SCRIPT = (
    r"""#!/bin/sh
# dedal: start one rank of an MPI step in a sandbox (run by srun on each node).
# The sandbox starts from a clean environment, so this rank's launcher variables
# (@NAMES@) go to the command inside on its standard input, which it loads first: no
# file is left behind when srun SIGKILLs the rank. The exit status is the command's.
# Called as `dedal-rank.sh @IMAGE@ MOUNTDIR IMAGE OFFSET CMD...` where CMD names an
# image mounted at MOUNTDIR on the node dedal runs on: on a node that does not have that
# mount (another node of the step) the ranks of the step mount IMAGE themselves, read-only,
# once for all of them (named after the step daemon, their common parent); the last rank
# to end unmounts it (or, when srun SIGKILLed the ranks, the next step that mounts on that
# node does: the step daemon named in the directory is gone then).
set -e
umask 077
# which machine this rank is on (parsers skip "#@" lines; dedal verify counts ranks per kernel)
echo "#@ dedal-rank: host=$(hostname) boot_id=$(cat /proc/sys/kernel/random/boot_id 2>/dev/null) cpus=$(grep -c ^processor /proc/cpuinfo 2>/dev/null) node=${SLURMD_NODENAME:-} step=${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-}" >&2
mnt= here=
unmount() { umount -l "$1" 2>/dev/null || fusermount3 -u -z "$1" 2>/dev/null || true; }
cleanup() {
  # the last rank of the step on this node (no other holds fd 8) unmounts; each lets go of
  # its own hold first, so that of ranks ending at once (scancel) one always gets there
  if [ -n "$here" ] && flock -u 8 && flock -n -x 8; then
    flock -x 9
    unmount "$here"
    rmdir "$here" 2>/dev/null || true
    rm -f "$here.setup" "$here.use"
  fi
  return 0
}
trap cleanup EXIT
trap 'cleanup; trap - EXIT; exit 143' TERM
if [ "${1:-}" = "@IMAGE@" ]; then
  mnt=$2 img=$3 off=$4
  shift 4
  if [ -z "$(ls -A "$mnt" 2>/dev/null)" ]; then
    # fd 8, shared: held while this rank runs; fd 9: one rank at a time sets up or tears down.
    # The last rank out removes both files: a lock taken on a removed file counts for nothing
    while :; do
      here=
      exec 8>>"/tmp/dedal-rank-root.$PPID.$off.use" 9>>"/tmp/dedal-rank-root.$PPID.$off.setup"
      here=/tmp/dedal-rank-root.$PPID.$off
      flock -s 8
      [ "$(stat -Lc %i /proc/$$/fd/8)" = "$(stat -c %i "$here.use" 2>/dev/null)" ] && break
    done
    flock -x 9
    for old in /tmp/dedal-rank-root.*.*.use; do
      old=${old%.use}
      [ -O "$old.use" ] || continue
      pid=${old#/tmp/dedal-rank-root.}
      pid=${pid%%.*}
      case $pid in ''|*[!0-9]*) continue ;; esac
      [ -d "/proc/$pid" ] && continue
      unmount "$old"
      rmdir "$old" 2>/dev/null || true
      rm -f "$old.setup" "$old.use"
    done
    if ! mountpoint -q "$here" 2>/dev/null; then
      mkdir -p "$here"
      if ! { [ "$(id -u)" = 0 ] && mount -t squashfs -o "loop,ro,offset=$off" "$img" "$here" 2>/dev/null; } &&
         ! squashfuse -o "offset=$off" "$img" "$here"; then
        echo "dedal-rank: cannot mount the image $img on $(hostname)" >&2
        exit 1
      fi
    fi
    flock -u 9
  fi
fi
if [ -n "$here" ]; then
  for a do
    shift
    case $a in "$mnt"|"$mnt"/*) a=$here${a#"$mnt"} ;; esac
    set -- "$@" "$a"
  done
fi
vars=$(export -p | sed -n -e 's/^declare -x /export /' -e '/^export \(@ALTERNATIVES@\)_[A-Za-z0-9_]*=/p')
# DEDAL_STEP and DEDAL_STEPD: the step and the step daemon that started this rank, so that a
# process left behind once the step is over (a container that outlived a SIGKILLed step) can be
# told from one of a live step
if [ -z "$here" ]; then
  # nothing to unmount afterwards: the runtime replaces this shell, so its parent is the step
  # daemon, the same for every rank of the step on this node (Apptainer's --sharens joins the
  # processes with the same parent into one container)
  exec "$@" <<EOF
$vars
export DEDAL_STEP=${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-} DEDAL_STEPD=$PPID
EOF
fi
set +e
"$@" <<EOF
$vars
export DEDAL_STEP=${SLURM_JOB_ID:-}.${SLURM_STEP_ID:-} DEDAL_STEPD=$PPID
EOF
""".replace("@NAMES@", ", ".join(p + "_*" for p in RANK_PREFIXES))
    .replace("@ALTERNATIVES@", "\\|".join(RANK_PREFIXES))
    .replace("@IMAGE@", IMAGE_TOKEN)
)


# /proc/self/fd/0 rather than /dev/stdin: some sandboxes bind the image's own /dev. The
# "#@ dedal-container:" line says, from inside, which container (mount namespace) the rank is
# in and which mount of the image it reads (the device of the file system /bin/sh is on), so
# that the report says how many of each the ranks of a node really had
_LOADER = (
    "set -a; . /proc/self/fd/0; set +a; read -r h < /proc/sys/kernel/hostname; "
    'echo "#@ dedal-container: host=$h mntns=$(readlink /proc/self/ns/mnt) '
    'imagedev=$(stat -Lc %d /bin/sh 2>/dev/null)" >&2; @MEET@@SESSION@exec "$@" </dev/null'
)


# Under Apptainer's --sharens the first rank of a node to start is the container: the others
# join it through its process, and one that joins after it ended fails ("first process with
# --sharens has already exited", or "Failed to restore current working directory: No such
# process" when it ends during the join), or even runs outside the image (seen once here: its
# /bin/sh was the host's, in a mount namespace of neither). MPI ranks wait in MPI_Init; any other
# program (`dedal run IMAGE -- hostname`) did so 8 times in 60 runs of 2 ranks here. So the
# ranks of a node meet first, in the host's /tmp (bound at /tmp), under a name of the step and
# the node: each leaves a file, the first to count all of them (the step's tasks on this node,
# from SLURM_STEP_TASKS_PER_NODE, "2(x3),1" and the like) leaves "go" for the rest, and each
# removes its own; the last out removes the folder. At most 30 s, then each goes on regardless.
_MEET = (
    'n=1 k=0 o=$IFS; IFS=,; for g in ${SLURM_STEP_TASKS_PER_NODE:-1}; do c=${g%%"(x"*} r=1; '
    'case $g in *"(x"*) r=${g#*"(x"} r=${r%")"} ;; esac; k=$((k + r)); '
    'if [ "${SLURM_NODEID:-0}" -lt "$k" ]; then n=$c; break; fi; done; IFS=$o; '
    "d=/tmp/dedal-meet.${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-0}.${SLURM_NODEID:-0} me=${SLURM_LOCALID:-$$} i=0; "
    'if [ "$n" -gt 1 ] && mkdir -p "$d" && : > "$d/$me"; then '
    'while [ ! -e "$d/go" ] && [ "$i" -lt 600 ]; do c=0; for f in "$d"/*; do c=$((c + 1)); done; '
    '[ "$c" -ge "$n" ] && break; sleep 0.05; i=$((i + 1)); done; '
    ': > "$d/go"; rm -f "$d/$me"; c=0; for f in "$d"/*; do c=$((c + 1)); done; '
    'if [ "$c" -le 1 ]; then rm -f "$d/go"; rmdir "$d"; fi; '
    "fi 2>/dev/null; "
)


# In a container that Apptainer's --sharens shares, Apptainer forwards a signal (srun's SIGTERM
# when a step is cancelled) to the process group of the program it started, which is not one:
# the signal reached nothing and the step outlived scancel. The program leads a session of its
# own (setsid, where the image has it), so the signal reaches it and what it started.
_SESSION = 'if command -v setsid >/dev/null; then exec setsid "$@" </dev/null; fi; '


def rank_command(program: Sequence[str], *, session: bool = False, meet: bool = False) -> List[str]:
    """The program as it runs inside a rank's sandbox: load the rank's launcher variables
    from standard input first (:data:`RANK_SCRIPT` gives them there), then run with standard
    input closed off; ``session``: as the leader of a session of its own (in a container
    that Apptainer's --sharens shares: see :data:`_SESSION`); ``meet``: only once every rank
    of the step on this node has started (the container --sharens makes of the first: see
    :data:`_MEET`)."""
    loader = _LOADER.replace("@SESSION@", _SESSION if session else "").replace("@MEET@", _MEET if meet else "")
    return ["/bin/sh", "-c", loader, "dedal-rank", *[os.fspath(p) for p in program]]


def write_rank_script(directory: Path) -> Path:
    """Write :data:`RANK_SCRIPT` into ``directory`` (on storage every node sees)."""
    return write_atomic(directory / "dedal-rank.sh", RANK_SCRIPT, mode=0o755)


# Keeps one Apptainer instance of an image on a node while its step runs (one task per node):
# `dedal-instance STOP START...` runs START (apptainer instance start ... IMAGE NAME), says so,
# and runs STOP when the step ends (scancel, srun's SIGTERM when dedal stops it).
INSTANCE_SCRIPT = r"""
stop=$1
shift
"$@" >&2 || exit 1
trap 'eval "$stop" >/dev/null 2>&1; exit 0' TERM INT HUP
echo "#@ dedal-instance: ready on ${SLURMD_NODENAME:-$(hostname)}"
while :; do sleep 3600 & wait $!; done
"""


# Kills what a step left running on a node: the processes the rank script marked (DEDAL_STEP,
# DEDAL_STEPD) as of one of the steps named as arguments (steps that are over), or of a step
# daemon that is gone. Under Slurm's proctrack/linuxproc, a container that Apptainer's
# --sharens made for a node can outlive a SIGKILLed step (it is no descendant of the step
# daemon any more, and the daemon cannot kill it); proctrack/cgroup kills it.
REAP_SCRIPT = r"""
for f in $(grep -lsz '^DEDAL_STEPD=' /proc/[0-9]*/environ 2>/dev/null); do
  pid=${f#/proc/}; pid=${pid%/environ}
  marks=$(tr '\0' '\n' < "$f" 2>/dev/null)
  step=$(echo "$marks" | sed -n 's/^DEDAL_STEP=//p' | head -n 1)
  stepd=$(echo "$marks" | sed -n 's/^DEDAL_STEPD=//p' | head -n 1)
  over=
  for s do [ "$s" = "$step" ] && over=1; done
  if [ -z "$over" ]; then
    case $stepd in ''|*[!0-9]*) continue ;; esac
    [ "$(cat "/proc/$stepd/comm" 2>/dev/null)" = slurmstepd ] && continue
  fi
  kill -KILL "$pid" 2>/dev/null && echo "#@ dedal: reaped pid $pid of step $step on $(hostname)"
done
exit 0
"""
