"""The limits of the verification's checks (:mod:`dedal.stages.verify.checks` applies them),
their defaults from the published measurements (``shared/notes/papers.md``), and how an
environment file's ``dedal.verify.thresholds`` or ``dedal verify -t`` override them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Mapping, Optional

from dedal.errors import UserError


@dataclass
class Thresholds:
    """Limits of the checks; each can be set in ``env.yaml`` under ``dedal.verify.thresholds``
    (its schema lists them all) and by ``dedal verify -t KEY=VALUE``."""

    latency_overhead_us: float = 0.5  # container - native, small messages
    bandwidth_pct: float = 2.0  # loss of OSU bandwidth, large messages
    busbw_pct: float = 2.0  # loss of NCCL bus bandwidth, large messages
    init_overhead_pct: float = 15.0  # MPI_Init (osu_init) overhead
    # a whole job's extra wall time always allowed (the larger of it and init_overhead_pct applies):
    # entering the image is a fixed cost (apptainer exec of the demo's SIF: 80-170 ms here, into a
    # running instance about 45 ms) that made a 0.3 s job 16 % longer; paper 001 saw < 5 s extra
    # job time up to 6,144 nodes (../shared/notes/papers.md)
    startup_overhead_ms: float = 250.0
    small_message_max: int = 128 * 1024  # latency is compared in us up to here, in % above (bandwidth_pct)
    bandwidth_min_size: int = 64 * 1024  # smaller messages are latency-bound: bandwidth not checked there
    busbw_min_size: int = 1 << 20  # NCCL bus bandwidth is checked from 1 MiB on
    noise_sigmas: float = 3.0  # an excess within this many deviations of the repetitions is noise

    @classmethod
    def from_mapping(cls, data: Optional[Mapping[str, Any]]) -> "Thresholds":
        """Defaults overridden by ``data`` (e.g. ``dedal.verify.thresholds`` of an env file)."""
        known = {f.name: f for f in fields(cls)}
        values: Dict[str, Any] = {}
        for key, value in (data or {}).items():
            if key not in known:
                raise UserError(f"unknown verification threshold {key!r}; known: {', '.join(known)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise UserError(f"verification threshold {key}: expected a number >= 0, got {value!r}")
            if known[key].type in ("int", int):
                if value != int(value):  # a byte count: 1.5 was taken as 1
                    raise UserError(f"verification threshold {key}: expected a whole number of bytes, got {value!r}")
                values[key] = int(value)
            else:
                values[key] = float(value)
        return cls(**values)

    def to_json(self) -> Dict[str, Any]:
        return asdict(self)
