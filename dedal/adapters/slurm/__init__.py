"""Slurm: the adapter through which dedal submits, follows and cancels batch jobs.

* :mod:`~dedal.adapters.slurm.client`: :class:`Slurm`, the only code that runs Slurm
  commands (sbatch, squeue, sacct, scancel, scontrol, sinfo, srun), and module-level
  shortcuts (``submit``, ``states``, ``cancel``, ``nodes``, ``mpi_plugins``) that use a
  fresh client on the process environment;
* :mod:`~dedal.adapters.slurm.reports`: what Slurm reports, as :class:`State`,
  :class:`JobState` and :class:`Node`, and the parsing of squeue's and sacct's fields;
* :mod:`~dedal.adapters.slurm.conf`: where Slurm's configuration comes from, and the clear
  errors (:class:`SlurmNotConfigured`, :class:`SlurmUnavailable`) for Slurm's own lines
  when there is none, it is broken or its controller does not answer;
* :mod:`~dedal.adapters.slurm.times`: Slurm time limits in minutes and back;
* :mod:`~dedal.adapters.slurm.template`: the job-script template and its rendering.

Callers import from here; the modules depend on each other only as listed
(client on reports and conf; the others on nothing in this package).
"""

from __future__ import annotations

from dedal.adapters.slurm.client import HINT, Slurm, cancel, mpi_plugins, nodes, states, submit
from dedal.adapters.slurm.conf import SlurmNotConfigured, SlurmUnavailable
from dedal.adapters.slurm.reports import JobState, Node, State
from dedal.adapters.slurm.template import TEMPLATE_FIELDS, default_template, render_job_script
from dedal.adapters.slurm.times import time_minutes, time_text

__all__ = [
    "HINT",
    "JobState",
    "Node",
    "Slurm",
    "SlurmNotConfigured",
    "SlurmUnavailable",
    "State",
    "TEMPLATE_FIELDS",
    "cancel",
    "default_template",
    "mpi_plugins",
    "nodes",
    "render_job_script",
    "states",
    "submit",
    "time_minutes",
    "time_text",
]
