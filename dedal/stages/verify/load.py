"""The host's load before a verification's runs: other work on the node makes the timings of
both sides noisy, so the preflight says how busy the host is, and build-image asks it again
before it trusts a report measured on a busy host."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Collection, FrozenSet, List, Optional, Tuple

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding


def allowed_cpus() -> Optional[FrozenSet[int]]:
    """The CPUs this process may run on where that is fewer than the host's (a Slurm step's
    cpuset, ``taskset``), else None: the whole host."""
    try:
        allowed = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return allowed if allowed and len(allowed) < (os.cpu_count() or 0) else None


def cpu_in_use(
    stat: Path = Path("/proc/stat"),
    window: float = 0.25,
    sleep: Callable[[float], None] = time.sleep,
    allowed: Optional[Collection[int]] = None,
) -> Optional[float]:
    """The share of the CPUs' time spent working (not idle, not waiting for I/O) over the next
    ``window`` seconds; None where /proc/stat cannot be read. The CPUs are ``allowed`` (per-CPU
    lines: on a node shared with other jobs, theirs are not this verification's noise) or, when
    None or not listed, all of them (the first line)."""
    names = {f"cpu{i}" for i in allowed} if allowed else set()

    def ticks() -> Tuple[int, int]:
        total = idle = 0
        lines = [line.split() for line in stat.read_text().splitlines() if line.startswith("cpu")]
        chosen = [f for f in lines if f[0] in names] or [f for f in lines[:1] if f[0] == "cpu"]
        if not chosen:
            raise ValueError("no cpu line")
        for _name, *values in chosen:
            v = [int(x) for x in values[:8]]  # user nice system idle iowait irq softirq steal
            if len(v) < 5:
                raise ValueError(_name)
            total, idle = total + sum(v), idle + v[3] + v[4]
        return total, idle

    try:
        total0, idle0 = ticks()
        sleep(window)
        total1, idle1 = ticks()
    except (OSError, ValueError):
        return None
    if total1 <= total0:
        return None
    return min(1.0, max(0.0, 1 - (idle1 - idle0) / (total1 - total0)))


def check_load(
    loadavg: Path = Path("/proc/loadavg"),
    cpus: Optional[int] = None,
    stat: Path = Path("/proc/stat"),
    sleep: Callable[[float], None] = time.sleep,
    allowed: Optional[Collection[int]] = None,
) -> List[Finding]:
    """Other work on the node makes the timings of both sides noisy (ranks busy-poll for
    messages): say so, with the numbers, so a failed timing check is read in that light. Busy
    means more than half the CPUs in use now (:func:`cpu_in_use`); the 1-minute load average,
    shown beside, still counts work that has just ended (build-image's own build and assembly
    before its verification made every first run "busy"), and decides only where /proc/stat
    cannot be read. In a cpuset only its CPUs count: other jobs on a shared node do not make
    the ranks' CPUs busy (``allowed``: those CPUs; None: :func:`allowed_cpus`; empty: the host's)."""
    cpus = cpus or os.cpu_count() or 1
    allowed = allowed_cpus() if allowed is None else allowed
    try:
        line = loadavg.read_text().strip()
        load1: Optional[float] = float(line.split()[0])
    except (OSError, ValueError, IndexError):
        line, load1 = "", None
    in_use = cpu_in_use(stat, sleep=sleep, allowed=allowed)
    if in_use is None and load1 is None:
        return []
    load = f"load average {load1:.2f}" if load1 is not None else "no load average"
    which = f"the {len(allowed)} CPU(s) this job may use of {cpus}" if allowed else f"{cpus} CPU(s)"
    now = f"{in_use:.0%} of {which} in use, {load}" if in_use is not None else f"{load} on {cpus} CPU(s)"
    if in_use is not None:
        busy = in_use > 0.5
    else:
        busy = load1 is not None and load1 > 0.5 * cpus
    evidence = [f"/proc/loadavg: {line}"] if line else []
    if busy:
        return [
            F.warning(
                "host-busy",
                f"the host is busy before the runs start ({now}): timing differences between native and "
                "container runs may be noise; verify on an idle node (e.g. a Slurm allocation with --exclusive) "
                "for a firm verdict",
                evidence,
            )
        ]
    return [F.info("host-load", f"{now} before the runs")]


def host_busy(
    loadavg: Path = Path("/proc/loadavg"), cpus: Optional[int] = None, stat: Path = Path("/proc/stat")
) -> bool:
    """Whether this host is busy now, by :func:`check_load`'s rule (more than half its CPUs in
    use): a verification started now would say ``host-busy``."""
    return any(f.code == "host-busy" for f in check_load(loadavg, cpus, stat))
