"""What a verification report says about how it was made (``meta``: the report's
provenance): the image and which of its bytes were verified, the native and container
sides, the launcher, the run plan and environment, the host, the transports seen and one
result line per check.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, Mapping, Sequence

from dedal import __version__
from dedal.model.artifacts import sha256_file
from dedal.stages.verify import image as img
from dedal.stages.verify.native import Native
from dedal.stages.verify import preflight as pre
from dedal.stages.verify.options import Options
from dedal.stages.verify.plan import DEBUG_ENV, SIDES, Plan


def container_text(backend: str, launcher: str) -> str:
    """How the container side runs, in words (the report and each run log's header)."""
    tmp = "/tmp" if launcher == "mpirun" else "the host's /tmp (PMIx rendezvous)"
    how = {
        "apptainer": f"apptainer exec (private /dev/shm, {tmp}; the image's environment scripts)",
        "bwrap": f"bubblewrap sandbox of the mounted image (private /dev and /run, "
        f"{tmp}; the image's environment scripts)",
        "charliecloud": "ch-run (own user namespace per process)",
    }
    share = {
        "apptainer": "the ranks of a node in one container (--sharens where Apptainer has it)",
        "bwrap": "a sandbox per rank over one mount of the image per node",
        "charliecloud": "a ch-run per rank over one mount of the image per node",
    }
    where = (
        "the image's own mpirun and its ranks in one container"
        if launcher == "mpirun"
        else f"srun --mpi=pmix, {share.get(backend, 'a container per rank')} (Slurm's PMIx server on the "
        "host; a node other than this one mounts the image itself)"
    )
    return f"{how.get(backend, backend)}; {where}"


def report_meta(
    opts: Options,
    info: img.ImageInfo,
    native: Native,
    launcher: str,
    backend: str,
    nodes: int,
    plan: Plan,
    started: float,
    t0: float,
    transports: Mapping[str, Any],
    summary: Sequence[Mapping[str, Any]],
    pf: pre.Preflight,
) -> Dict[str, Any]:
    env = {**DEBUG_ENV, **opts.env}
    meta: Dict[str, Any] = {
        "image": str(info.path),
        "image_kind": info.kind,
        "image_target": f"{info.target or 'unknown'}" + (f" ({info.target_source})" if info.target_source else ""),
        "image_versions": ", ".join(f"{k} {v}" for k, v in sorted(info.versions.items())) or "not labelled",
        "benchmarks": ", ".join(
            f"{b.name} ({info.programs.get(b.name) or info.programs[b.program]}"
            + (f" {' '.join(b.args(0, 0)[:2])}{' D D' if b.suite == 'osu' else ''})" if b.device else ")")
            for b in plan.benches
        ),
        "native": native.description,
        "native_mode": native.mode,
        "container": container_text(backend, launcher),
        "runtime": backend,
        "launcher": launcher,
        "ranks": f"{plan.ranks} per node for init/all-reduce, 2 for latency/bandwidth",
        "nodes": nodes,
        "scopes": ", ".join(s for s, _ in plan.scopes),
        "repetitions": plan.repetitions,
        "order": "interleaved: each repetition runs native and container back to back, alternating which goes "
        "first; one unmeasured warm-up per side",
        "run_env": " ".join(f"{k}={v}" for k, v in env.items()),
        "user_env": " ".join(f"{k}={v}" for k, v in opts.env.items()) or "none",
        "max_message_size": opts.max_size,
        "settings_sha256": opts.settings_digest(),
        "host": f"{socket.gethostname()}, {platform.system()} {platform.release()}, {pf.facts.get('cpu_model') or '?'}"
        f", {os.cpu_count()} CPU(s)",
        "host_infiniband": ", ".join(pf.facts.get("infiniband") or []) or "none",
        "host_nvidia_driver": pf.facts.get("nvidia_driver") or "none",
        "started": datetime.fromtimestamp(started, timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.monotonic() - t0, 1),
        "dedal_version": __version__,
        "raw_logs": "raw/<scope>/<program>/<side>-<repetition>.log: the benchmark output and the UCX/Open MPI debug "
        "output of each run",
    }
    if native.root is not None:
        meta["native_root"] = str(native.root)
    for side in SIDES:
        for scope, tls in (transports.get(side) or {}).items():
            meta[f"transports_{side}_{scope}"] = ", ".join(tls)
    for s in summary:
        ratio = f" (x{s['ratio']:.3f})" if s.get("ratio") is not None else ""
        where = f" at {s['size']} B" if s.get("size") else ""
        meta[f"result {s['check']}"] = (
            f"native {s['native']:.4g} {s['unit']}, container {s['container']:.4g} {s['unit']}{ratio}{where}"
        )
    if Path(opts.image).is_file():  # which bytes were verified: lets build-image reuse this report
        meta["image_sha256"] = sha256_file(Path(opts.image))
    return meta
