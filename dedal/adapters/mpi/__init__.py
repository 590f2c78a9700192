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

This package is its public face; the parts:

* ``launch``: the steps (:func:`run_mpirun`, :func:`run_srun`, :func:`run_ranks`, the
  command lines), their timeouts as results, the reaping after a failed or cancelled step;
* ``scripts``: the shell that runs on the nodes (the rank script, the loader inside the
  sandbox, the instance holder, the reaper);
* ``instances``: the Apptainer instances the steps of a block join (:func:`local_instance`,
  :func:`node_instances`);
* ``host``: the host's own ``mpirun`` and programs.
"""

from __future__ import annotations

from dedal.adapters.mpi.host import host_mpirun, host_which, shell_join
from dedal.adapters.mpi.instances import local_instance, node_instances
from dedal.adapters.mpi.launch import (
    MPIRUN_HINT,
    SESSION_VAR,
    StepResult,
    env_names,
    missing_on_nodes,
    mpirun_command,
    reap_left_behind,
    run_mpirun,
    run_ranks,
    run_srun,
    run_srun_attached,
    srun_command,
)
from dedal.adapters.mpi.scripts import (
    IMAGE_TOKEN,
    INSTANCE_SCRIPT,
    RANK_PREFIXES,
    RANK_SCRIPT,
    REAP_SCRIPT,
    rank_command,
    write_rank_script,
)

__all__ = [
    "host_mpirun",
    "host_which",
    "shell_join",
    "local_instance",
    "node_instances",
    "MPIRUN_HINT",
    "SESSION_VAR",
    "StepResult",
    "env_names",
    "missing_on_nodes",
    "mpirun_command",
    "reap_left_behind",
    "run_mpirun",
    "run_ranks",
    "run_srun",
    "run_srun_attached",
    "srun_command",
    "IMAGE_TOKEN",
    "INSTANCE_SCRIPT",
    "RANK_PREFIXES",
    "RANK_SCRIPT",
    "REAP_SCRIPT",
    "rank_command",
    "write_rank_script",
]
