"""Application checks (``dedal.verify.apps`` of the environment file).

The benchmarks show that the image's MPI stack is as fast as the host's; they do not show
that the applications the image is for start, find their libraries and talk MPI. Each app
check runs one command of the image in the container, launched as users launch it (``srun
--mpi=pmix``, one container per rank, or the image's ``mpirun``), and passes on exit 0
with its expected output (a regular expression) found. A failure makes the verdict bad;
an app that needs more nodes than the run has is reported as skipped, never as passed.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from dedal.adapters import mpi, runtime
from dedal.model.envfile import OWN_TEST_NAME, AppCheck
from dedal.model.image import SYMLINKS
from dedal.stages.verify import findings as F
from dedal.stages.verify.checks import CheckResult, skipped_check

METRIC, UNIT = "app", "-"


#: the image's own test, as `apptainer test IMAGE` runs it (dedal writes it: stages/assemble/usage)
OWN_TEST = AppCheck(
    name=OWN_TEST_NAME,
    command=["/" + SYMLINKS[".test"]],  # /.singularity.d/actions/test
    ranks=1,
    nodes=1,
    expect=r": all \d+ checks passed$",
    timeout=300,
)


def own_test(labels: Dict[str, Any]) -> AppCheck:
    """The check of the image's own test: one that dedal assembled ends on "all N checks
    passed"; another image's (``%test`` of `apptainer build`) passes on exit 0 alone."""
    return OWN_TEST if labels.get("dedal.env") else dataclasses.replace(OWN_TEST, expect="")


def check_name(app: AppCheck) -> str:
    return f"app {app.name}"


def skip_reason(app: AppCheck, launcher: str, nodes: int, no_gpu: str = "") -> str:
    """Why ``app`` cannot run here ("" when it can): more nodes than the run has, or a GPU
    application where no GPU is used (``no_gpu``: why not, "" when the run uses the GPU)."""
    if app.gpu and no_gpu:
        return no_gpu
    if app.nodes > 1 and launcher != "srun":
        return f"needs {app.nodes} nodes (srun inside a Slurm allocation)"
    if app.nodes > nodes:
        return f"needs {app.nodes} nodes, the run has {nodes}"
    return ""


def judge(
    app: AppCheck, returncode: Optional[int], timed_out: bool, seconds: float, log: Path, rel: str
) -> CheckResult:
    """The check's verdict from the run's exit code and output (``log``)."""
    where = f"{app.ranks} rank(s) on {app.nodes} node(s)"
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    output = program_output(app, text)
    match = re.search(app.expect, output, re.MULTILINE) if app.expect else None
    if timed_out:
        problem = f"did not finish within {app.timeout:g} s"
    elif returncode != 0:
        problem = f"exited with code {returncode}"
    elif app.expect and match is None:
        problem = f"exited 0 but its output lacks /{app.expect}/"
    else:
        line = line_of(output, match) if match else ""
        found = f"; expected output: {line}" if line else ""
        finding = F.info("app-check", f"{check_name(app)}: exit 0 in {seconds:.1f} s, {where}{found}", [f"log: {rel}"])
        return CheckResult(check_name(app), METRIC, UNIT, "good", [finding])
    finding = F.error(
        "app-check-failed",
        f"{check_name(app)} ({where}) {problem}; log {rel}",
        [ln for ln in output.splitlines() if ln.strip()][-6:] + [f"log: {rel}"],
    )
    return CheckResult(check_name(app), METRIC, UNIT, "bad", [finding])


def program_output(app: AppCheck, text: str) -> str:
    """What ``app`` printed: its run's log (``text``) without dedal's lines, where its
    expected output and its metric are looked for."""
    return "\n".join(_output_lines(text, sum(a.count("\n") for a in app.command)))


def _output_lines(text: str, continued: int) -> List[str]:
    """The program's output: the log without dedal's notes (``#@``) and the command line
    (``$ ...``), which continues over ``continued`` more lines when an argument is a
    multi-line script (whose text must not count as the program's output)."""
    out: List[str] = []
    skip = 0
    for line in text.splitlines():
        if skip:
            skip -= 1
        elif line.startswith("$ "):
            skip = continued
        elif not line.startswith("#@"):
            out.append(line)
    return out


def line_of(text: str, match: "re.Match[str]") -> str:
    """The line of ``text`` where ``match`` is (at most 200 characters)."""
    start = text.rfind("\n", 0, match.start()) + 1
    end = text.find("\n", match.end())
    return text[start : end if end >= 0 else len(text)].strip()[:200]


def run_apps(
    apps: Sequence[AppCheck],
    *,
    root: runtime.RootArg,
    launcher: str,
    nodes: int,
    outdir: Path,
    runtime_name: str,
    env: Dict[str, str],
    binds: Sequence[runtime.Bind] = (),
    image_mount: Optional[Tuple[str, str, int]] = None,
    no_gpu: str = "",
    progress: Any = None,
) -> List[CheckResult]:
    """Run every app check (those without a metric) in the container ``root``; one CheckResult
    each (skipped where it cannot run here; ``no_gpu``: why GPU apps cannot, "" when they can).
    ``env`` (the verification's variables) is given to every rank, the app's own ``env`` over it."""
    out: List[CheckResult] = []
    rawdir = outdir / "raw"
    for app in apps:
        if app.metric is not None:
            continue  # an application benchmark: native and container (dedal.stages.verify.appbench)
        reason = skip_reason(app, launcher, nodes, no_gpu)
        if reason:
            out.append(skipped_check(check_name(app), METRIC, UNIT, reason, gpu=app.gpu))
            continue
        rel = f"raw/apps/{app.name}.log"
        log = outdir / rel
        log.parent.mkdir(parents=True, exist_ok=True)
        note = [f"dedal verify: app check {app.name} ({app.ranks} rank(s) on {app.nodes} node(s), launcher {launcher})"]
        res = mpi.run_ranks(
            launcher,
            root,
            app.command,
            app.ranks,
            nodes=app.nodes,
            env={**env, **app.env},
            log=log,
            script_dir=rawdir / ".launch",
            timeout=app.timeout,
            runtime_name=runtime_name,
            binds=binds,
            note=note,
            image_mount=image_mount,
        )
        check = judge(app, res.returncode, res.timed_out, res.seconds, log, rel)
        if progress:
            progress(f"app {app.name}: {res.seconds:.1f} s {check.verdict}")
        out.append(check)
    return out
