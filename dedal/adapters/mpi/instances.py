"""Apptainer instances that the MPI steps of a block join, so that each step's ranks use one
mount of the image instead of mounting it (and decompressing the MPI stack) anew:
:func:`local_instance` on this machine (mpirun), :func:`node_instances` one per node of the
allocation (srun steps).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import time
from pathlib import Path
from typing import Iterator, List, Mapping, Optional, Sequence

from dedal.adapters import proc, runtime
from dedal.adapters.mpi.launch import read_log, with_host_tmp, write_notes
from dedal.adapters.mpi.scripts import INSTANCE_SCRIPT
from dedal.errors import ToolError


#: the line INSTANCE_SCRIPT writes once the instance runs on a node
_READY = re.compile(r"^#@ dedal-instance: ready on (\S+)$", re.M)
#: how long the holder step of :func:`node_instances` may take to end on SIGTERM: its task on
#: every node stops the instance first (``apptainer instance stop``), which on a loaded node
#: took longer than proc's general 5 s; an srun SIGKILLed then leaves its step to Slurm's
#: asynchronous cleanup, still listed after the verification returned
HOLDER_STOP_GRACE_S = 30.0


@contextlib.contextmanager
def local_instance(
    image: Path, *, log: Path, binds: Sequence[runtime.Bind] = (), nv: bool = False, timeout: float = 120
) -> Iterator[Optional[runtime.Instance]]:
    """One Apptainer instance of ``image`` on this machine for the block, which the runs of
    ``mpirun`` in the container join (launcher and ranks in it), as :func:`node_instances` is for
    srun steps: each run would otherwise mount the image anew and decompress the MPI stack again
    (MPI_Init 1.4x native with 2 ranks on 2 cores: the README's demo verification failed on
    that by chance). The host's ``/tmp`` is bound (mpirun's session directory is made there).
    None where it did not start (said in ``log``): then one container per run."""
    name = f"dedal-{os.getpid()}-{secrets.token_hex(3)}"
    env = runtime.apptainer_env(dict(os.environ))
    write_notes(log, [f"dedal: one Apptainer instance {name} of {image} on this machine"])
    try:
        started = proc.run(
            runtime.instance_start_command(image, name, binds=with_host_tmp(binds), nv=nv),
            what="apptainer instance start",
            log=log,
            env=env,
            check=False,
            timeout=timeout,
        ).returncode
    except ToolError as exc:  # timed out (124): what started is stopped below
        started = exc.returncode
    try:
        if started != 0:
            write_notes(log, [f"dedal: the instance did not start (exit {started}): one container per run"])
            yield None
        else:
            yield runtime.Instance(name, Path(image))
    finally:
        try:
            stop = proc.run(
                runtime.instance_stop_command(name),
                what="apptainer instance stop",
                log=log,
                env=env,
                check=False,
                timeout=timeout,
            ).returncode
        except ToolError as exc:  # timed out (124)
            stop = exc.returncode
        if stop != 0 and started == 0:
            write_notes(log, [f"dedal: stopping instance {name} exited {stop}"])


@contextlib.contextmanager
def node_instances(
    image: Path,
    nodes: int,
    *,
    log: Path,
    binds: Sequence[runtime.Bind] = (),
    nv: bool = False,
    slurm_env: Optional[Mapping[str, str]] = None,
    timeout: float = 180,
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
    start = runtime.instance_start_command(image, name, binds=with_host_tmp(binds), nv=nv)
    per_node = ["srun", "--overlap", "-N", str(nodes), "-n", str(nodes), "--ntasks-per-node=1", "--quiet"]
    run_env = runtime.apptainer_env(env)
    write_notes(log, [f"dedal: one Apptainer instance {name} of {image} per node ({nodes} node(s))"])
    offset = log.stat().st_size
    holder = proc.start(
        [*per_node, "/bin/sh", "-c", INSTANCE_SCRIPT, "dedal-instance", stop, *start],
        log=log,
        env=run_env,
        die_with_parent=True,
    )
    ready: List[str] = []
    try:
        deadline = time.monotonic() + timeout
        while True:
            ready = _READY.findall(read_log(log)[offset:])
            if len(ready) >= nodes:
                break
            if holder.poll() is not None or time.monotonic() > deadline:
                write_notes(log, [f"dedal: the instances did not start (exit {holder.poll()}): one container per step"])
                yield None
                return
            time.sleep(0.1)
        # the steps that join the instances must run where they are: in an allocation of more
        # nodes than the step, Slurm sends a step to the least busy nodes, those without one
        yield runtime.Instance(name, Path(image), tuple(sorted(ready)))
    finally:
        proc.stop(holder, HOLDER_STOP_GRACE_S, group=True)
        where = ["-w", ",".join(sorted(ready))] if len(ready) >= nodes else []  # else wherever Slurm puts it
        res = proc.run(
            [*per_node, *where, "/bin/sh", "-c", f"{stop} >/dev/null 2>&1; exit 0"],
            what="srun (instance stop)",
            log=log,
            env=run_env,
            check=False,
            timeout=120,
        )
        if res.returncode != 0:
            write_notes(log, [f"dedal: stopping instance {name} on the nodes exited {res.returncode}"])
