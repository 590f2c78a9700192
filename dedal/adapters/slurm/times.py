"""Slurm time limits (``--time``) as whole minutes and back.

Used for job time limits (``slurm.time``, estimate times ``slurm.time_factor``) and by
the schedule benchmarks; Slurm rounds seconds up to the next minute, and so do these.
"""

from __future__ import annotations

from typing import Optional


def time_minutes(text: str) -> Optional[int]:
    """A Slurm time limit (``--time``: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``) in whole minutes, rounded up as Slurm does; None for no limit (empty,
    ``UNLIMITED``, ``INFINITE``). ValueError on anything else."""
    t = text.strip()
    if t == "" or t.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, sep, rest = t.partition("-")
    if not sep:
        days, rest = "0", t
    fields = rest.split(":")
    if not days.isdigit() or not all(f.isdigit() for f in fields) or len(fields) > 3:
        raise ValueError(f"not a Slurm time limit: {text!r}")
    nums = [int(f) for f in fields]
    if sep:  # D-H, D-H:M, D-H:M:S
        h, m, sec = (nums + [0, 0])[:3]
    elif len(nums) == 3:  # H:M:S
        h, m, sec = nums
    else:  # M, M:S
        h, m, sec = 0, nums[0], (nums[1] if len(nums) == 2 else 0)
    return (int(days) * 24 + h) * 60 + m + (1 if sec else 0)


def time_text(minutes: int) -> str:
    """Whole minutes as a Slurm time limit, ``H:MM:00``."""
    return f"{minutes // 60}:{minutes % 60:02d}:00"
