"""Where Slurm's configuration comes from, and what to tell a user when there is none.

Slurm's commands read ``$SLURM_CONF``, else the slurm.conf of their build (Debian's:
/etc/slurm/slurm.conf), else ask DNS for a controller (configless Slurm). Without any of
them every command fails with "resolve_ctls_from_dns_srv: res_nsearch error" and "DNS SRV
lookup failed", which reads like a network problem; a ``SLURM_CONF`` naming a missing file
makes each command retry for 60 s first. :func:`before_use` catches the missing file
before any command runs, :func:`explain` turns Slurm's own words into one clear line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from dedal.errors import DedalError, UserError

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
FIX = "set SLURM_CONF to the cluster's slurm.conf, or run dedal on a machine of the cluster (a login node)"


class SlurmNotConfigured(UserError):
    """Slurm has no usable configuration here (exit 2: a setting to fix, nothing was done)."""


class SlurmUnavailable(DedalError):
    """Slurm's controller does not answer (down, restarting, unreachable from here)."""


def before_use(environ: Mapping[str, str]) -> None:
    """Raise SlurmNotConfigured for a ``SLURM_CONF`` that names no file (Slurm would retry
    reading it for a minute before failing)."""
    conf = environ.get("SLURM_CONF", "")
    if conf and not os.path.isfile(conf):
        raise SlurmNotConfigured(f"SLURM_CONF={conf}: no such file; {FIX}")


def explain(output: str, environ: Mapping[str, str]) -> Optional[DedalError]:
    """The clear error for a Slurm command's failure ``output`` when it comes from the
    configuration or an unreachable controller; None for any other failure."""
    conf = environ.get("SLURM_CONF", "")
    if "Could not establish a configuration source" in output or "DNS SRV lookup failed" in output:
        where = (
            f"SLURM_CONF is not set, there is no {DEFAULT_CONF}" if not conf else f"SLURM_CONF={conf} could not be used"
        )
        return SlurmNotConfigured(
            f"no Slurm configuration: {where}, and no Slurm controller is announced by DNS (configless Slurm); {FIX}"
        )
    if "Unable to process configuration file" in output:
        why = [ln.split("error:", 1)[1].strip() for ln in output.splitlines() if "error:" in ln]
        name = conf or str(DEFAULT_CONF)
        return SlurmNotConfigured(
            f"Slurm cannot use its configuration {name}" + (f" ({'; '.join(why[:3])})" if why else "") + f"; {FIX}"
        )
    if "Unable to contact slurm controller" in output:
        return SlurmUnavailable(
            f"the Slurm controller (slurmctld) of {conf or DEFAULT_CONF} does not answer: "
            "is it running and reachable from here? (`scontrol ping` tells)"
        )
    return None
