"""What dedal knows of Slurm's jobs and nodes: :class:`State`, :class:`JobState`, :class:`Node`.

Slurm's many job states are mapped onto the small :class:`State` enum (its base state
first, flags such as ``REQUEUED`` or ``COMPLETING`` after). The field parsers below read
the values :mod:`dedal.adapters.slurm.client` gets from ``squeue`` and ``sacct``: exit
codes as a raw wait status (squeue JSON of 22.05), as an object (23.02+) or as sacct's
``ExitCode`` (``3:0``, ``0:9``), and the placeholders Slurm prints for "no node" or "no
reason". Pure data and parsing: nothing here runs a command.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union


class State(str, Enum):
    """What dedal needs to know about a job; Slurm's other states map onto these."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    PREEMPTED = "PREEMPTED"
    BOOT_FAIL = "BOOT_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def is_node_failure(self) -> bool:
        """Lost to the machine, not to the build: worth resubmitting."""
        return self in (State.NODE_FAIL, State.PREEMPTED, State.BOOT_FAIL)

    @property
    def is_active(self) -> bool:
        return self in (State.PENDING, State.RUNNING)

    @property
    def is_finished(self) -> bool:
        return self not in (State.PENDING, State.RUNNING, State.UNKNOWN)

    @property
    def is_success(self) -> bool:
        return self is State.COMPLETED

    @classmethod
    def from_slurm(cls, text: Union[str, Sequence[str], None]) -> "State":
        """Map a Slurm state name (``CANCELLED by 0``, ``CD``, ``["PENDING", "REQUEUED"]``) to a State."""
        if text is None:
            return cls.UNKNOWN
        if not isinstance(text, str):
            names = [str(t) for t in text]
            for name in names:  # base state first, flags (REQUEUED, COMPLETING, ...) after
                state = cls.from_slurm(name)
                if state is not cls.UNKNOWN:
                    return state
            return cls.UNKNOWN
        word = text.strip().split(" ")[0].upper().rstrip("+")
        return _STATE_MAP.get(word, cls.UNKNOWN)


_STATE_MAP: Dict[str, State] = {}
for _state, _names in {
    State.PENDING: (
        "PENDING",
        "PD",
        "REQUEUED",
        "RQ",
        "REQUEUE_HOLD",
        "RH",
        "REQUEUE_FED",
        "RF",
        "CONFIGURING",
        "CF",
        "RESV_DEL_HOLD",
        "RD",
        "SUSPENDED",
        "S",
        "STOPPED",
        "ST",
    ),
    State.RUNNING: (
        "RUNNING",
        "R",
        "COMPLETING",
        "CG",
        "STAGE_OUT",
        "SO",
        "SIGNALING",
        "SI",
        "RESIZING",
        "RS",
        "UPDATE_DB",
    ),
    State.COMPLETED: ("COMPLETED", "CD"),
    State.FAILED: ("FAILED", "F", "SPECIAL_EXIT", "SE"),
    State.CANCELLED: ("CANCELLED", "CA", "REVOKED", "RV"),
    State.TIMEOUT: ("TIMEOUT", "TO", "DEADLINE", "DL"),
    State.NODE_FAIL: ("NODE_FAIL", "NF"),
    State.PREEMPTED: ("PREEMPTED", "PR"),
    State.BOOT_FAIL: ("BOOT_FAIL", "BF"),
    State.OUT_OF_MEMORY: ("OUT_OF_MEMORY", "OOM"),
}.items():
    for _name in _names:
        _STATE_MAP[_name] = _state


@dataclass(frozen=True)
class JobState:
    """One job as Slurm reports it.

    ``exit_code`` is the batch script's exit status once known (``None`` before, or when
    killed by a signal: then ``signal`` is set). ``node`` is the batch host (or node
    list), empty while pending. ``reason`` is Slurm's reason (``Dependency``,
    ``NonZeroExitCode``, ``NodeDown``, ...), empty when there is none.
    """

    state: State
    exit_code: Optional[int] = None
    node: str = ""
    reason: str = ""
    signal: Optional[int] = None
    source: str = ""  # squeue | sacct | sacct -c

    @property
    def is_node_failure(self) -> bool:
        return self.state.is_node_failure

    def to_json(self) -> Dict[str, Any]:
        return {
            "state": self.state.value,
            "exit_code": self.exit_code,
            "node": self.node,
            "reason": self.reason,
            "signal": self.signal,
            "source": self.source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "JobState":
        return cls(
            State(data["state"]),
            data.get("exit_code"),
            data.get("node", ""),
            data.get("reason", ""),
            data.get("signal"),
            data.get("source", ""),
        )


@dataclass(frozen=True)
class Node:
    """One node as ``sinfo -N`` reports it (a node in several partitions is listed once)."""

    name: str
    cpus: int
    state: str  # sinfo's long state, lower case: idle, mixed, allocated, down*, drained, ...
    memory_mb: int = 0
    partitions: Tuple[str, ...] = ()
    features: Tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """Can take jobs now or soon (not down, drained, failing or not responding)."""
        if self.state.endswith("*"):  # not responding
            return False
        base = self.state.rstrip("~#!%$@^-").split("+")[0]
        return base in ("idle", "mixed", "allocated", "completing", "planned", "reserved")

    def to_json(self) -> Dict[str, Any]:
        return {**asdict(self), "partitions": list(self.partitions), "features": list(self.features)}


def wait_status(value: Any) -> Tuple[Optional[int], Optional[int]]:
    """(exit code, signal) from squeue JSON: a raw wait status (22.05) or an object (23.02+)."""
    if isinstance(value, bool) or value is None:
        return None, None
    if isinstance(value, int):
        if value & 0x7F:
            return None, value & 0x7F
        return (value >> 8) & 0xFF, None
    if isinstance(value, dict):
        rc = value.get("return_code")
        sig = value.get("signal")
        if isinstance(rc, dict):
            rc = rc.get("number") if rc.get("set", True) else None
        if isinstance(sig, dict):
            sig = sig.get("id", sig.get("signal_id"))
            sig = sig.get("number") if isinstance(sig, dict) and sig.get("set", True) else sig
            sig = sig if isinstance(sig, int) else None
        if sig:
            return None, int(sig)
        return (int(rc) if isinstance(rc, int) else None), None
    return None, None


def exit_pair(text: str) -> Tuple[Optional[int], Optional[int]]:
    """(exit code, signal) from sacct's ``ExitCode`` (``3:0``, ``0:9``)."""
    code, _, sig = text.strip().partition(":")
    try:
        c, s = int(code), int(sig or 0)
    except ValueError:
        return None, None
    if s:
        return None, s
    return c, None


def clean_node(text: Any) -> str:
    t = str(text or "").strip()
    return "" if t in ("(null)", "None assigned", "n/a", "None") else t


def clean_reason(text: Any) -> str:
    t = str(text or "").strip()
    return "" if t in ("None", "(null)") else t
