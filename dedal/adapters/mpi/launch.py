"""Launching MPI steps: ``mpirun`` (Open MPI 5 / PRRTE) inside a root or on the host, and
``srun --mpi=pmix`` with one sandbox per rank (:func:`run_srun`), each rank through the rank
script of :mod:`dedal.adapters.mpi.scripts`; :func:`run_ranks` chooses between them the way
verification does. A timeout is a result (exit code 124), not an exception; after a step that
failed or was cancelled, what it left on the nodes is reaped (:func:`reap_left_behind`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence, Tuple

from dedal.adapters import proc, runtime, slurm
from dedal.adapters.mpi.scripts import IMAGE_TOKEN, RANK_SCRIPT, REAP_SCRIPT, rank_command, write_rank_script
from dedal.errors import ToolError, signals_held


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


def mpirun_command(
    program: Sequence[str],
    ranks: int,
    *,
    env: Mapping[str, str] = {},
    oversubscribe: bool = False,
    extra: Sequence[str] = (),
) -> List[str]:
    """``mpirun -np RANKS [--oversubscribe] -x VAR ... PROGRAM`` (Open MPI 5 / PRRTE)."""
    cmd = ["mpirun", "-np", str(int(ranks))]
    if oversubscribe:
        cmd.append("--oversubscribe")
    cmd += env_names(env)
    cmd += list(extra)
    return cmd + [os.fspath(p) for p in program]


def srun_command(
    program: Sequence[str],
    ranks: int,
    *,
    nodes: int = 1,
    mpi: str = "pmix",
    extra: Sequence[str] = (),
    nodelist: Sequence[str] = (),
) -> List[str]:
    """``srun --mpi=pmix -N NODES -n RANKS [--ntasks-per-node=...] PROGRAM``; with several
    nodes the ranks are spread evenly (one per node for a two-rank point-to-point test).
    ``nodelist``: the step runs on the first NODES of these nodes (``-w``), not where Slurm
    likes (in an allocation larger than the step, a step goes to the least busy nodes)."""
    cmd = ["srun", f"--mpi={mpi}", "-N", str(int(nodes)), "-n", str(int(ranks))]
    if nodelist:
        cmd += ["-w", ",".join(list(nodelist)[: int(nodes)])]
    if nodes > 1 and ranks % nodes == 0:
        cmd.append(f"--ntasks-per-node={ranks // nodes}")
    cmd += ["--kill-on-bad-exit=1", "--quiet"]
    cmd += list(extra)
    return cmd + [os.fspath(p) for p in program]


_VISIBLE = 'for p do [ -e "$p" ] || echo "missing $(hostname) $p"; done'


def missing_on_nodes(paths: Sequence[Path], nodes: int, *, timeout: float = 120) -> List[Tuple[str, str]]:
    """(node, path) for each of ``paths`` that one task per node of an ``srun`` step over
    ``nodes`` nodes cannot see: what the ranks need from storage every node shares (the
    rank script, the native root, the image). Empty also when the step itself cannot run:
    its error comes with the first real step, with its log."""
    cmd = srun_command(["/bin/sh", "-c", _VISIBLE, "dedal-visible", *[os.fspath(p) for p in paths]], nodes, nodes=nodes)
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


def write_notes(log: Path, lines: Sequence[str]) -> None:
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


def run_mpirun(
    root: runtime.RootArg,
    program: Sequence[str],
    ranks: int,
    *,
    env: Mapping[str, str],
    log: Path,
    timeout: Optional[float] = None,
    runtime_name: str = "auto",
    binds: Sequence[runtime.Bind] = (),
    nv: bool = False,
    oversubscribe: bool = False,
    note: Sequence[str] = (),
    cwd: Optional[Path] = None,
) -> StepResult:
    """``mpirun`` of ``root`` inside ``root`` (the launcher and all ranks in one sandbox),
    or the host's own ``mpirun`` with the caller's environment when ``root`` is None.
    ``note`` lines are written to ``log`` first (as ``#@`` lines, which parsers skip),
    then the command and every rank's stdout and stderr. A timeout is returned as exit
    code 124, not raised. ``cwd``: the working directory of mpirun and its ranks (a path
    the sandbox has at the same place: a bind of the caller's)."""
    cmd = mpirun_command(program, ranks, env=env, oversubscribe=oversubscribe)
    write_notes(log, note)
    start = time.monotonic()
    # PRRTE's session directory (prterun.<node>.<pid>.<uid>) under a directory of this run's
    # own, removed afterwards: one that a killed mpirun (a timeout, a stopped test) left in
    # a /tmp shared with the host made a later mpirun that got the same PID fail in
    # prte_init ("prte_session_dir failed", PMIX_ERR_EXISTS); 28 had piled up here
    session = ""
    ended = False
    try:
        # made and named in one step, removed in one step: a stop signal (scancel, a stopped
        # test) between the mkdir and the name, or halfway through the removal, left an
        # empty dedal-prte.* in /tmp (one in a full test run); it now waits for the step's end
        with signals_held():
            session = tempfile.mkdtemp(prefix="dedal-prte.", dir="/tmp")
        run_env = {**env, SESSION_VAR: session}
        if root is None:
            proc.which("mpirun", MPIRUN_HINT)
            host_env = dict(os.environ)
            host_env.update(run_env)
            res = proc.run(cmd, what="mpirun", log=log, env=host_env, timeout=timeout, check=False, cwd=cwd)
        else:
            res = runtime.run_in(
                root,
                cmd,
                binds=binds,
                env=run_env,
                log=log,
                what="mpirun",
                runtime=runtime_name,
                timeout=timeout,
                check=False,
                nv=nv,
                cwd=cwd,
            )
        ended = True
    except ToolError as exc:
        if not _timed_out(exc):
            raise
        return _killed(log, timeout, cmd, start)
    finally:
        with signals_held():
            if session and not ended:
                # mpirun was killed (a timeout, a stop signal): its ranks and daemons can outlive
                # it for a moment, outside its sandbox's process tree, and a rank still in
                # MPI_Init made the session directory again after its removal (one left in /tmp
                # per interrupted run); they carry the session in their environment
                proc.kill_marked(SESSION_VAR, session)
            if session:
                shutil.rmtree(session, ignore_errors=True)
    return StepResult(res.returncode, res.seconds, cmd)


def run_srun(
    root: runtime.RootArg,
    program: Sequence[str],
    ranks: int,
    *,
    env: Mapping[str, str],
    log: Path,
    script_dir: Path,
    nodes: int = 1,
    timeout: Optional[float] = None,
    runtime_name: str = "auto",
    binds: Sequence[runtime.Bind] = (),
    nv: bool = False,
    slurm_env: Optional[Mapping[str, str]] = None,
    note: Sequence[str] = (),
    image_mount: Optional[Tuple[str, str, int]] = None,
    share: bool = True,
    cwd: Optional[Path] = None,
    nodelist: Sequence[str] = (),
) -> StepResult:
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
    write_notes(log, note)
    start = time.monotonic()
    try:
        if root is None:
            res = proc.run(shown, what="srun", log=log, env=outer, timeout=timeout, check=False, cwd=cwd)
            return StepResult(res.returncode, res.seconds, shown)
        script = ["/bin/sh", os.fspath(write_rank_script(script_dir))]
        offset = log.stat().st_size if log.exists() else 0
        with _rank_step(
            root,
            program,
            ranks,
            nodes=nodes,
            script=script,
            env=env,
            runtime_name=runtime_name,
            binds=binds,
            nv=nv,
            share=share,
            image_mount=image_mount,
            cwd=os.fspath(cwd) if cwd is not None else None,
            nodelist=nodelist,
        ) as cmd:
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
def _rank_step(
    root: runtime.RootArg,
    program: Sequence[str],
    ranks: int,
    *,
    nodes: int,
    script: Sequence[str],
    env: Mapping[str, str],
    runtime_name: str,
    binds: Sequence[runtime.Bind],
    nv: bool,
    share: bool,
    image_mount: Optional[Tuple[str, str, int]] = None,
    cwd: Optional[str] = None,
    nodelist: Sequence[str] = (),
) -> Iterator[List[str]]:
    """The ``srun`` command line of a step of ``program`` in ``root``: each rank runs
    ``script`` (the rank script, as a file or inline) around the runtime's command, the
    host's ``/tmp`` bound (PMIx's rendezvous files); what ``prepared`` mounted stays mounted
    while the block runs; ``nodelist``: where the step runs (:func:`run_srun` gives an instance's nodes)."""
    all_binds = with_host_tmp(binds)
    joined = isinstance(root, runtime.Instance)  # its nodes have it: the step overlaps the step that keeps it
    shared = joined or (share and runtime.shares_per_node(runtime_name))
    with runtime.prepared(
        root,
        rank_command(program, session=shared, meet=shared and not joined),  # an instance outlives the step
        binds=all_binds,
        env=env,
        cwd=cwd,
        runtime=runtime_name,
        nv=nv,
        per_node=share,
    ) as prep:
        mount = prep.mount or image_mount
        image = [IMAGE_TOKEN, mount[0], mount[1], str(mount[2])] if mount else []
        yield srun_command(
            [*script, *image, *prep.argv], ranks, nodes=nodes, extra=["--overlap"] if joined else [], nodelist=nodelist
        )


def with_host_tmp(binds: Sequence[runtime.Bind]) -> List[runtime.Bind]:
    """``binds`` with the host's ``/tmp`` at ``/tmp``: where PMIx puts its rendezvous files."""
    return [runtime.Bind("/tmp", "/tmp")] + [b for b in binds if b.target != "/tmp"]


def run_srun_attached(
    root: runtime.RootArg,
    program: Sequence[str],
    ranks: int,
    *,
    nodes: int,
    env: Mapping[str, str],
    runtime_name: str = "auto",
    binds: Sequence[runtime.Bind] = (),
    nv: bool = False,
    share: bool = True,
    cwd: Optional[str] = None,
) -> int:
    """:func:`run_srun`'s step, its output on this terminal (``dedal run``); the exit code.
    The rank script goes inline (``sh -c``): nothing needs storage that every node sees."""
    proc.which("srun", slurm.HINT)
    inline = ["/bin/sh", "-c", RANK_SCRIPT, "dedal-rank"]
    with _rank_step(
        root,
        program,
        ranks,
        nodes=nodes,
        script=inline,
        env=env,
        runtime_name=runtime_name,
        binds=binds,
        nv=nv,
        share=share,
        cwd=cwd,
    ) as cmd:
        return proc.call(cmd, env={**os.environ, **env})


def reap_left_behind(log: Path, slurm_env: Mapping[str, str], timeout: float = 180) -> None:
    """After a step that failed, timed out or was cancelled: one task on each node its ranks
    ran on (the Slurm node names and the step of the rank script's ``#@ dedal-rank:`` lines in
    ``log``) kills the processes of that step still there (:data:`REAP_SCRIPT`); what it reaped
    is appended to ``log``. Best effort: a node that cannot be reached is left as it is.

    The reaping job waits for its nodes: processes that outlived the cancelled step keep that
    job COMPLETING until Slurm gives up on them (``UnkillableStepTimeout``, 60 s by default,
    after ``KillWait``), and only then is the node free. A 60 s limit lost that race about
    every other time on the test cluster and left the processes running."""
    ranks = re.findall(r"^#@ dedal-rank: .* node=(\S+) step=(\S+)$", read_log(log), re.M)
    hosts = sorted({node for node, _ in ranks})
    if not hosts:
        return
    cmd = [
        "srun",
        "-N",
        str(len(hosts)),
        "-n",
        str(len(hosts)),
        "--ntasks-per-node=1",
        "-w",
        ",".join(hosts),
        "--quiet",
        "/bin/sh",
        "-c",
        REAP_SCRIPT,
        "dedal-reap",
        *sorted({step for _, step in ranks}),
    ]
    try:
        proc.run(cmd, what="srun (reap)", log=log, env=dict(slurm_env), timeout=timeout, check=False)
    except ToolError:
        pass


#: what srun and the step daemon print when a step is cancelled (scancel, a signal): srun's exit
#: code may still be 0 then (Slurm 22.05, when the tasks end on the signal it forwards)
_CANCELLED = re.compile(
    r"\*\*\* STEP \S+ ON \S+ CANCELLED AT|Timed out waiting for job step to complete|"
    r"Job step aborted|Force Terminated"
)


def _cancelled(log: Path, offset: int) -> bool:
    """Whether the step written to ``log`` from ``offset`` on was cancelled."""
    return bool(_CANCELLED.search(read_log(log)[offset:]))


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def run_ranks(
    launcher: str,
    root: runtime.RootArg,
    program: Sequence[str],
    ranks: int,
    *,
    nodes: int,
    env: Mapping[str, str],
    log: Path,
    script_dir: Path,
    timeout: Optional[float] = None,
    runtime_name: str = "auto",
    binds: Sequence[runtime.Bind] = (),
    nv: bool = False,
    note: Sequence[str] = (),
    image_mount: Optional[Tuple[str, str, int]] = None,
    cwd: Optional[Path] = None,
    nodelist: Sequence[str] = (),
) -> StepResult:
    """``program`` on ``ranks`` ranks the way verification launches everything: with
    ``launcher`` "srun", :func:`run_srun` over ``nodes`` nodes; otherwise :func:`run_mpirun`
    on this machine, oversubscribed when there are more ranks than CPUs (``nodes``,
    ``nodelist`` and ``image_mount`` concern srun only); ``cwd``: the ranks' working directory."""
    if launcher == "srun":
        return run_srun(
            root,
            program,
            ranks,
            env=env,
            log=log,
            script_dir=script_dir,
            nodes=nodes,
            timeout=timeout,
            runtime_name=runtime_name,
            binds=binds,
            nv=nv,
            note=note,
            image_mount=image_mount,
            cwd=cwd,
            nodelist=nodelist,
        )
    return run_mpirun(
        root,
        program,
        ranks,
        env=env,
        log=log,
        timeout=timeout,
        runtime_name=runtime_name,
        binds=binds,
        nv=nv,
        oversubscribe=ranks > (os.cpu_count() or 1),
        note=note,
        cwd=cwd,
    )
