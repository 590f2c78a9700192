"""MPI launchers: ``mpirun`` (Open MPI 5 / PRRTE) and ``srun --mpi=pmix`` steps.

The one place that starts MPI jobs. A step runs one program on ``ranks`` processes
either

* **inside a root** (an image, or an unpacked root filesystem): ``mpirun`` of the root
  itself, started through the container runtime (:func:`dedal.adapters.runtime.run_in`),
  so the launcher and every rank share one sandbox; or ``srun --mpi=pmix`` on the host
  with **one sandbox per rank**, the way ``srun --mpi=pmix apptainer exec IMAGE prog``
  runs on a cluster (Slurm's PMIx server on the host, the image's PMIx client inside);
* **on the host** (``root=None``): the host's own ``mpirun`` / ``srun`` and programs,
  with the caller's environment (``PATH`` of a loaded module or Spack view).

Slurm's job bookkeeping (sbatch, squeue, sacct, ``srun --mpi=list``) stays in
:mod:`dedal.adapters.slurm`; this module only launches MPI steps with ``srun``.

**The environment of a rank.** The runtime starts every command from a clean
environment (Apptainer's ``--cleanenv``), which would drop the ``PMIX_*``/``SLURM_*``
variables ``srun`` gives each rank and without which ``MPI_Init`` cannot find its
PMIx server. So a per-rank step runs a small host-side script (:data:`RANK_SCRIPT`)
that starts the sandbox with the rank's ``PMIX_``/``PMI_``/``SLURM_`` variables on its
standard input; inside, the program is preceded by a shell that loads them from there
(:func:`rank_command`). Nothing is written to disk for this: ``srun`` turns a SIGTERM it
gets into a SIGKILL of its tasks, so a file a rank meant to delete on its way out would be
left in ``/tmp`` of every node whenever dedal stops a step. The host's ``/tmp`` is bound
into the sandbox for the PMIx rendezvous files, as Apptainer does by default.

Facts this relies on (``../shared/notes/real-components.md`` sections 4 and 5): Open
MPI 5's UCX pml needs ``pml_ucx_tls=any pml_ucx_devices=any`` where no Mellanox device
exists; with Slurm 22.05's PMIx 4 server only the UCX pml works (ob1 hangs), so callers
set ``OMPI_MCA_pml=ucx``; ``srun --export=ALL,A=x,y`` splits at commas, so variables
are passed in the environment of ``srun`` instead.
"""
from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from dedal.adapters import proc, runtime, slurm
from dedal.errors import ToolError, ToolMissing
from dedal.model.artifacts import write_atomic

#: variables of a rank that the launcher sets and the program needs inside the sandbox
RANK_PREFIXES = ("PMIX", "PMI", "SLURM")
IMAGE_TOKEN = "@DEDAL_IMAGE@"
RANK_SCRIPT = r"""#!/bin/sh
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
""".replace("@NAMES@", ", ".join(p + "_*" for p in RANK_PREFIXES)).replace(
    "@ALTERNATIVES@", "\\|".join(RANK_PREFIXES)).replace("@IMAGE@", IMAGE_TOKEN)
# /proc/self/fd/0 rather than /dev/stdin: some sandboxes bind the image's own /dev. The
# "#@ dedal-container:" line says, from inside, which container (mount namespace) the rank is
# in and which mount of the image it reads (the device of the file system /bin/sh is on), so
# that the report says how many of each the ranks of a node really had
_LOADER = ('set -a; . /proc/self/fd/0; set +a; read -r h < /proc/sys/kernel/hostname; '
           'echo "#@ dedal-container: host=$h mntns=$(readlink /proc/self/ns/mnt) '
           'imagedev=$(stat -Lc %d /bin/sh 2>/dev/null)" >&2; @SESSION@exec "$@" </dev/null')
# In a container that Apptainer's --sharens shares, Apptainer forwards a signal (srun's SIGTERM
# when a step is cancelled) to the process group of the program it started, which is not one:
# the signal reached nothing and the step outlived scancel. The program leads a session of its
# own (setsid, where the image has it), so the signal reaches it and what it started.
_SESSION = 'if command -v setsid >/dev/null; then exec setsid "$@" </dev/null; fi; '
MPIRUN_HINT = "no mpirun on the host: install Open MPI, load its module, or verify with --native rootfs"


@dataclass
class StepResult:
    """What a step left behind: exit code (124: timed out), seconds, the command as run."""

    returncode: int
    seconds: float
    command: List[str]
    timed_out: bool = False


def env_names(env: Mapping[str, str]) -> List[str]:
    """``-x NAME`` arguments for mpirun: every variable of ``env`` except mpirun's own
    permission switches (exported into the launcher, not meant for the ranks)."""
    out: List[str] = []
    for name in env:
        if name in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "PATH", "HOME", "USER", "LANG", "TERM"):
            continue
        out += ["-x", name]
    return out


# where PRRTE puts its session directory: Debian's Open MPI 5.0.7 follows TMPDIR (else
# /tmp) and ignores the prte_top_session_dir MCA parameter (PRTE_MCA_...); a TMPDIR
# missing in the sandbox (a private /tmp) it creates there
SESSION_VAR = "TMPDIR"


def mpirun_command(program: Sequence[str], ranks: int, *, env: Mapping[str, str] = {},
                   oversubscribe: bool = False, extra: Sequence[str] = ()) -> List[str]:
    """``mpirun -np RANKS [--oversubscribe] -x VAR ... PROGRAM`` (Open MPI 5 / PRRTE)."""
    cmd = ["mpirun", "-np", str(int(ranks))]
    if oversubscribe:
        cmd.append("--oversubscribe")
    cmd += env_names(env)
    cmd += list(extra)
    return cmd + [os.fspath(p) for p in program]


def srun_command(program: Sequence[str], ranks: int, *, nodes: int = 1, mpi: str = "pmix",
                 extra: Sequence[str] = (), nodelist: Sequence[str] = ()) -> List[str]:
    """``srun --mpi=pmix -N NODES -n RANKS [--ntasks-per-node=...] PROGRAM``; with several
    nodes the ranks are spread evenly (one per node for a two-rank point-to-point test).
    ``nodelist``: the step runs on the first NODES of these nodes (``-w``), not where Slurm
    likes (in an allocation larger than the step, a step goes to the least busy nodes)."""
    cmd = ["srun", f"--mpi={mpi}", "-N", str(int(nodes)), "-n", str(int(ranks))]
    if nodelist:
        cmd += ["-w", ",".join(list(nodelist)[:int(nodes)])]
    if nodes > 1 and ranks % nodes == 0:
        cmd.append(f"--ntasks-per-node={ranks // nodes}")
    cmd += ["--kill-on-bad-exit=1", "--quiet"]
    cmd += list(extra)
    return cmd + [os.fspath(p) for p in program]


def rank_command(program: Sequence[str], *, session: bool = False) -> List[str]:
    """The program as it runs inside a rank's sandbox: load the rank's launcher variables
    from standard input first (:data:`RANK_SCRIPT` gives them there), then run with standard
    input closed off; ``session``: as the leader of a session of its own (in a container
    that Apptainer's --sharens shares: see :data:`_SESSION`)."""
    loader = _LOADER.replace("@SESSION@", _SESSION if session else "")
    return ["/bin/sh", "-c", loader, "dedal-rank", *[os.fspath(p) for p in program]]


_VISIBLE = 'for p do [ -e "$p" ] || echo "missing $(hostname) $p"; done'


def missing_on_nodes(paths: Sequence[Path], nodes: int, *, timeout: float = 120) -> List[Tuple[str, str]]:
    """(node, path) for each of ``paths`` that one task per node of an ``srun`` step over
    ``nodes`` nodes cannot see: what the ranks need from storage every node shares (the
    rank script, the native root, the image). Empty also when the step itself cannot run:
    its error comes with the first real step, with its log."""
    cmd = srun_command(["/bin/sh", "-c", _VISIBLE, "dedal-visible", *[os.fspath(p) for p in paths]], nodes,
                       nodes=nodes)
    try:
        res = proc.run(cmd, what="srun", timeout=timeout, check=False)
    except ToolError:
        return []
    out = []
    for line in res.stdout.splitlines():
        word, _, rest = line.partition(" ")
        node, _, path = rest.partition(" ")
        if word == "missing" and path:
            out.append((node, path))
    return out


def write_rank_script(directory: Path) -> Path:
    """Write :data:`RANK_SCRIPT` into ``directory`` (on storage every node sees)."""
    return write_atomic(directory / "dedal-rank.sh", RANK_SCRIPT, mode=0o755)


def _header(log: Path, lines: Sequence[str]) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as fh:
        for line in lines:
            fh.write(f"#@ {line}\n")


def _timed_out(exc: ToolError) -> bool:
    """proc.run raises on a timeout even with check=False; only that is caught here."""
    return exc.returncode == 124 and exc.detail.startswith("timed out")


def _killed(log: Path, timeout: Optional[float], cmd: List[str], start: float) -> StepResult:
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"#@ dedal: the step did not finish within {timeout or 0:g} s and was killed\n")
    return StepResult(124, time.monotonic() - start, cmd, timed_out=True)


def run_mpirun(root: runtime.RootArg, program: Sequence[str], ranks: int, *, env: Mapping[str, str], log: Path,
               timeout: Optional[float] = None, runtime_name: str = "auto", binds: Sequence[runtime.Bind] = (),
               nv: bool = False, oversubscribe: bool = False, note: Sequence[str] = (),
               cwd: Optional[Path] = None) -> StepResult:
    """``mpirun`` of ``root`` inside ``root`` (the launcher and all ranks in one sandbox),
    or the host's own ``mpirun`` with the caller's environment when ``root`` is None.
    ``note`` lines are written to ``log`` first (as ``#@`` lines, which parsers skip),
    then the command and every rank's stdout and stderr. A timeout is returned as exit
    code 124, not raised. ``cwd``: the working directory of mpirun and its ranks (a path
    the sandbox has at the same place: a bind of the caller's)."""
    cmd = mpirun_command(program, ranks, env=env, oversubscribe=oversubscribe)
    _header(log, note)
    start = time.monotonic()
    # PRRTE's session directory (prterun.<node>.<pid>.<uid>) under a directory of this run's
    # own, removed afterwards: one that a killed mpirun (a timeout, a stopped test) left in
    # a /tmp shared with the host made a later mpirun that got the same PID fail in
    # prte_init ("prte_session_dir failed", PMIX_ERR_EXISTS); 28 had piled up here
    session = tempfile.mkdtemp(prefix="dedal-prte.", dir="/tmp")
    run_env = {**env, SESSION_VAR: session}
    try:
        if root is None:
            proc.which("mpirun", MPIRUN_HINT)
            host_env = dict(os.environ)
            host_env.update(run_env)
            res = proc.run(cmd, what="mpirun", log=log, env=host_env, timeout=timeout, check=False, cwd=cwd)
        else:
            res = runtime.run_in(root, cmd, binds=binds, env=run_env, log=log, what="mpirun", runtime=runtime_name,
                                 timeout=timeout, check=False, nv=nv, cwd=cwd)
    except ToolError as exc:
        if not _timed_out(exc):
            raise
        return _killed(log, timeout, cmd, start)
    finally:
        shutil.rmtree(session, ignore_errors=True)
    return StepResult(res.returncode, res.seconds, cmd)


def run_srun(root: runtime.RootArg, program: Sequence[str], ranks: int, *, env: Mapping[str, str], log: Path,
             script_dir: Path, nodes: int = 1, timeout: Optional[float] = None, runtime_name: str = "auto",
             binds: Sequence[runtime.Bind] = (), nv: bool = False, slurm_env: Optional[Mapping[str, str]] = None,
             note: Sequence[str] = (), image_mount: Optional[Tuple[str, str, int]] = None,
             share: bool = True, cwd: Optional[Path] = None, nodelist: Sequence[str] = ()) -> StepResult:
    """``srun --mpi=pmix`` with the ranks of a node in one container of ``root`` (Apptainer's
    ``--sharens``; bwrap and ch-run sandboxes over the one mount of the image; see the module
    notes on the rank environment), or the host's program directly when ``root`` is None.
    ``share=False``: a container of its own for every rank (as plain ``srun apptainer exec``).
    A step that did not end well is followed by :func:`reap_left_behind` on its nodes.
    ``slurm_env``: the environment Slurm's commands run in (``SLURM_CONF``...; default
    this process's); ``env`` is added to it and given to the ranks. ``script_dir`` must
    be visible on every node (the rank script is written there). ``image_mount``: (mount
    directory, image file, offset) when ``root`` is an image the caller mounted: a rank on
    a node without that mount mounts the image there itself (so does a ``root`` that
    ``prepared`` mounts). A timeout is returned as exit code 124, not raised. ``cwd``: the
    ranks' working directory (on storage every node sees, bound into the container at the
    same path by the caller). ``nodelist``: the nodes the step runs on (its first ``nodes``;
    a ``root`` that is an instance runs on the instance's nodes)."""
    proc.which("srun", slurm.HINT)
    outer = dict(slurm_env if slurm_env is not None else os.environ)
    outer.update(env)
    if isinstance(root, runtime.Instance) and root.nodes:
        nodelist = root.nodes
    shown = srun_command(program, ranks, nodes=nodes, nodelist=nodelist)
    _header(log, note)
    start = time.monotonic()
    try:
        if root is None:
            res = proc.run(shown, what="srun", log=log, env=outer, timeout=timeout, check=False, cwd=cwd)
            return StepResult(res.returncode, res.seconds, shown)
        script = ["/bin/sh", os.fspath(write_rank_script(script_dir))]
        offset = log.stat().st_size if log.exists() else 0
        with _rank_step(root, program, ranks, nodes=nodes, script=script, env=env, runtime_name=runtime_name,
                        binds=binds, nv=nv, share=share, image_mount=image_mount,
                        cwd=os.fspath(cwd) if cwd is not None else None, nodelist=nodelist) as cmd:
            try:
                res = proc.run(cmd, what="srun", log=log, env=outer, timeout=timeout, check=False, shown=shown)
            except ToolError as exc:
                if not _timed_out(exc):
                    raise
                reap_left_behind(log, outer)
                return _killed(log, timeout, shown, start)
        if res.returncode != 0 or _cancelled(log, offset):
            reap_left_behind(log, outer)
        return StepResult(res.returncode, res.seconds, shown)
    except ToolError as exc:
        if not _timed_out(exc):
            raise
        return _killed(log, timeout, shown, start)


@contextlib.contextmanager
def _rank_step(root: runtime.RootArg, program: Sequence[str], ranks: int, *, nodes: int, script: Sequence[str],
               env: Mapping[str, str], runtime_name: str, binds: Sequence[runtime.Bind], nv: bool, share: bool,
               image_mount: Optional[Tuple[str, str, int]] = None, cwd: Optional[str] = None,
               nodelist: Sequence[str] = ()) -> Iterator[List[str]]:
    """The ``srun`` command line of a step of ``program`` in ``root``: each rank runs
    ``script`` (the rank script, as a file or inline) around the runtime's command, the
    host's ``/tmp`` bound (PMIx's rendezvous files); what ``prepared`` mounted stays mounted
    while the block runs. A step that joins an instance runs on the instance's nodes."""
    all_binds = _with_tmp(binds)
    joined = isinstance(root, runtime.Instance)  # its nodes have it: the step overlaps the step that keeps it
    if joined and root.nodes:
        nodelist = root.nodes
    shared = joined or (share and runtime.shares_per_node(runtime_name))
    with runtime.prepared(root, rank_command(program, session=shared), binds=all_binds, env=env, cwd=cwd,
                          runtime=runtime_name, nv=nv, per_node=share) as prep:
        mount = prep.mount or image_mount
        image = [IMAGE_TOKEN, mount[0], mount[1], str(mount[2])] if mount else []
        yield srun_command([*script, *image, *prep.argv], ranks, nodes=nodes, extra=["--overlap"] if joined else [],
                           nodelist=nodelist)


def _with_tmp(binds: Sequence[runtime.Bind]) -> List[runtime.Bind]:
    """``binds`` with the host's ``/tmp`` at ``/tmp``: where PMIx puts its rendezvous files."""
    return [runtime.Bind("/tmp", "/tmp")] + [b for b in binds if b.target != "/tmp"]


# Keeps one Apptainer instance of an image on a node while its step runs (one task per node):
# `dedal-instance STOP START...` runs START (apptainer instance start ... IMAGE NAME), says so,
# and runs STOP when the step ends (scancel, srun's SIGTERM when dedal stops it).
_READY = re.compile(r"^#@ dedal-instance: ready on (\S+)$", re.M)
INSTANCE_SCRIPT = r"""
stop=$1
shift
"$@" >&2 || exit 1
trap 'eval "$stop" >/dev/null 2>&1; exit 0' TERM INT HUP
echo "#@ dedal-instance: ready on ${SLURMD_NODENAME:-$(hostname)}"
while :; do sleep 3600 & wait $!; done
"""


@contextlib.contextmanager
def local_instance(image: Path, *, log: Path, binds: Sequence[runtime.Bind] = (), nv: bool = False,
                   timeout: float = 120) -> Iterator[Optional[runtime.Instance]]:
    """One Apptainer instance of ``image`` on this machine for the block, which the runs of
    ``mpirun`` in the container join (launcher and ranks in it), as :func:`node_instances` is for
    srun steps: each run would otherwise mount the image anew and decompress the MPI stack again
    (MPI_Init 1.4x native with 2 ranks on 2 cores: the README's demo verification failed on
    that by chance). The host's ``/tmp`` is bound (mpirun's session directory is made there).
    None where it did not start (said in ``log``): then one container per run."""
    name = f"dedal-{os.getpid()}-{secrets.token_hex(3)}"
    env = runtime.apptainer_env(dict(os.environ))
    _header(log, [f"dedal: one Apptainer instance {name} of {image} on this machine"])
    try:
        started = proc.run(runtime.instance_start_command(image, name, binds=_with_tmp(binds), nv=nv),
                           what="apptainer instance start", log=log, env=env, check=False,
                           timeout=timeout).returncode
    except ToolError as exc:  # timed out (124): what started is stopped below
        started = exc.returncode
    try:
        if started != 0:
            _header(log, [f"dedal: the instance did not start (exit {started}): one container per run"])
            yield None
        else:
            yield runtime.Instance(name, Path(image))
    finally:
        try:
            stop = proc.run(runtime.instance_stop_command(name), what="apptainer instance stop", log=log, env=env,
                            check=False, timeout=timeout).returncode
        except ToolError as exc:  # timed out (124)
            stop = exc.returncode
        if stop != 0 and started == 0:
            _header(log, [f"dedal: stopping instance {name} exited {stop}"])


@contextlib.contextmanager
def node_instances(image: Path, nodes: int, *, log: Path, binds: Sequence[runtime.Bind] = (), nv: bool = False,
                   slurm_env: Optional[Mapping[str, str]] = None, timeout: float = 180
                   ) -> Iterator[Optional[runtime.Instance]]:
    """One Apptainer instance of ``image`` on each of ``nodes`` nodes of the allocation this runs
    in, for the block: a step of one task per node (``srun --overlap``) starts it and stops it
    when the step ends; the steps that run in the block join it (:func:`run_srun` of the
    :class:`~dedal.adapters.runtime.Instance` yielded), so that every step's ranks use its one
    mount of the image, as the ranks of bwrap's and ch-run's steps use the one mount of the
    image dedal made: the steps measure the image's steady state, not a cold mount each. None
    (nothing started) outside an allocation, where each srun is a job of its own, or where the
    instances did not start (said in ``log``). Afterwards an instance still there (its step
    SIGKILLed) is stopped by a step of its own."""
    env = dict(slurm_env if slurm_env is not None else os.environ)
    if not env.get("SLURM_JOB_ID"):
        yield None
        return
    name = f"dedal-{os.getpid()}-{secrets.token_hex(3)}"
    stop = shlex.join(runtime.instance_stop_command(name))
    start = runtime.instance_start_command(image, name, binds=_with_tmp(binds), nv=nv)
    per_node = ["srun", "--overlap", "-N", str(nodes), "-n", str(nodes), "--ntasks-per-node=1", "--quiet"]
    run_env = runtime.apptainer_env(env)
    _header(log, [f"dedal: one Apptainer instance {name} of {image} per node ({nodes} node(s))"])
    offset = log.stat().st_size
    holder = proc.start([*per_node, "/bin/sh", "-c", INSTANCE_SCRIPT, "dedal-instance", stop, *start], log=log,
                        env=run_env, die_with_parent=True)
    ready: List[str] = []
    try:
        deadline = time.monotonic() + timeout
        while True:
            ready = _READY.findall(_read(log)[offset:])
            if len(ready) >= nodes:
                break
            if holder.poll() is not None or time.monotonic() > deadline:
                _header(log, [f"dedal: the instances did not start (exit {holder.poll()}): one container per step"])
                yield None
                return
            time.sleep(0.1)
        # the steps that join the instances must run where they are: in an allocation of more
        # nodes than the step, Slurm sends a step to the least busy nodes, those without one
        yield runtime.Instance(name, Path(image), tuple(sorted(ready)))
    finally:
        proc.stop(holder, group=True)
        where = ["-w", ",".join(sorted(ready))] if len(ready) >= nodes else []  # else wherever Slurm puts it
        res = proc.run([*per_node, *where, "/bin/sh", "-c", f"{stop} >/dev/null 2>&1; exit 0"],
                       what="srun (instance stop)",
                       log=log, env=run_env, check=False, timeout=120)
        if res.returncode != 0:
            _header(log, [f"dedal: stopping instance {name} on the nodes exited {res.returncode}"])


def run_srun_attached(root: runtime.RootArg, program: Sequence[str], ranks: int, *, nodes: int,
                      env: Mapping[str, str], runtime_name: str = "auto", binds: Sequence[runtime.Bind] = (),
                      nv: bool = False, share: bool = True, cwd: Optional[str] = None) -> int:
    """:func:`run_srun`'s step, its output on this terminal (``dedal run``); the exit code.
    The rank script goes inline (``sh -c``): nothing needs storage that every node sees."""
    proc.which("srun", slurm.HINT)
    inline = ["/bin/sh", "-c", RANK_SCRIPT, "dedal-rank"]
    with _rank_step(root, program, ranks, nodes=nodes, script=inline, env=env, runtime_name=runtime_name,
                    binds=binds, nv=nv, share=share, cwd=cwd) as cmd:
        return proc.call(cmd, env={**os.environ, **env})


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


def reap_left_behind(log: Path, slurm_env: Mapping[str, str], timeout: float = 180) -> None:
    """After a step that failed, timed out or was cancelled: one task on each node its ranks
    ran on (the Slurm node names and the step of the rank script's ``#@ dedal-rank:`` lines in
    ``log``) kills the processes of that step still there (:data:`REAP_SCRIPT`); what it reaped
    is appended to ``log``. Best effort: a node that cannot be reached is left as it is.

    The reaping job waits for its nodes: processes that outlived the cancelled step keep that
    job COMPLETING until Slurm gives up on them (``UnkillableStepTimeout``, 60 s by default,
    after ``KillWait``), and only then is the node free. A 60 s limit lost that race about
    every other time on the test cluster and left the processes running."""
    ranks = re.findall(r"^#@ dedal-rank: .* node=(\S+) step=(\S+)$", _read(log), re.M)
    hosts = sorted({node for node, _ in ranks})
    if not hosts:
        return
    cmd = ["srun", "-N", str(len(hosts)), "-n", str(len(hosts)), "--ntasks-per-node=1", "-w", ",".join(hosts),
           "--quiet", "/bin/sh", "-c", REAP_SCRIPT, "dedal-reap", *sorted({step for _, step in ranks})]
    try:
        proc.run(cmd, what="srun (reap)", log=log, env=dict(slurm_env), timeout=timeout, check=False)
    except ToolError:
        pass


#: what srun and the step daemon print when a step is cancelled (scancel, a signal): srun's exit
#: code may still be 0 then (Slurm 22.05, when the tasks end on the signal it forwards)
_CANCELLED = re.compile(r"\*\*\* STEP \S+ ON \S+ CANCELLED AT|Timed out waiting for job step to complete|"
                        r"Job step aborted|Force Terminated")


def _cancelled(log: Path, offset: int) -> bool:
    """Whether the step written to ``log`` from ``offset`` on was cancelled."""
    return bool(_CANCELLED.search(_read(log)[offset:]))


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def run_ranks(launcher: str, root: runtime.RootArg, program: Sequence[str], ranks: int, *, nodes: int,
              env: Mapping[str, str], log: Path, script_dir: Path, timeout: Optional[float] = None,
              runtime_name: str = "auto", binds: Sequence[runtime.Bind] = (), nv: bool = False,
              note: Sequence[str] = (), image_mount: Optional[Tuple[str, str, int]] = None,
              cwd: Optional[Path] = None, nodelist: Sequence[str] = ()) -> StepResult:
    """``program`` on ``ranks`` ranks the way verification launches everything: with
    ``launcher`` "srun", :func:`run_srun` over ``nodes`` nodes; otherwise :func:`run_mpirun`
    on this machine, oversubscribed when there are more ranks than CPUs (``nodes``,
    ``nodelist`` and ``image_mount`` concern srun only); ``cwd``: the ranks' working directory."""
    if launcher == "srun":
        return run_srun(root, program, ranks, env=env, log=log, script_dir=script_dir, nodes=nodes,
                        timeout=timeout, runtime_name=runtime_name, binds=binds, nv=nv, note=note,
                        image_mount=image_mount, cwd=cwd, nodelist=nodelist)
    return run_mpirun(root, program, ranks, env=env, log=log, timeout=timeout, runtime_name=runtime_name,
                      binds=binds, nv=nv, oversubscribe=ranks > (os.cpu_count() or 1), note=note, cwd=cwd)


# ---------------------------------------------------------------------------- host facts


def host_mpirun() -> Optional[Dict[str, str]]:
    """The host's ``mpirun`` (path and ``--version`` line), or None when there is none."""
    try:
        path = proc.which("mpirun")
    except ToolMissing:
        return None
    res = proc.run([path, "--version"], what="mpirun --version", check=False, timeout=30)
    text = (res.stdout + res.stderr).strip()
    first = text.splitlines()[0] if text else ""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", first)
    return {"path": path, "version_line": first, "version": m.group(1) if m else "",
            "open_mpi": "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text}


def host_which(name: str) -> Optional[str]:
    """A program on the host's PATH (e.g. the benchmarks of a host installation)."""
    try:
        return proc.which(name)
    except ToolMissing:
        return None


def shell_join(cmd: Sequence[str]) -> str:
    return shlex.join([os.fspath(c) for c in cmd])
