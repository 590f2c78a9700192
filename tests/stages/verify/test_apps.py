"""Application checks (dedal.verify.apps): the verdict from an app's exit code and output,
and when an app cannot run here. The runs themselves: test_runner_local.py (mpirun) and the
esd-neuro image's report (srun on the namespaced cluster)."""

from __future__ import annotations

from pathlib import Path

from dedal.model.envfile import AppCheck
from dedal.model.verify_report import skipped_text
from dedal.stages.verify import apps
from dedal.stages.verify.apps import judge, run_apps, skip_reason
from dedal.stages.verify.checks import overall_verdict

APP = AppCheck(name="ring", command=["python3", "ring.py"], ranks=2, nodes=2, expect=r"ranks=2 spiked=\d+", timeout=60)


def _log(tmp_path: Path, text: str) -> Path:
    log = tmp_path / "ring.log"
    log.write_text("#@ dedal verify: app check ring\n$ srun --mpi=pmix -N 2 -n 2 ... python3 ring.py\n" + text)
    return log


def test_exit_0_with_the_expected_output_is_good(tmp_path: Path) -> None:
    check = judge(APP, 0, False, 3.25, _log(tmp_path, "starting\nranks=2 spiked=10\n"), "raw/apps/ring.log")
    assert check.verdict == "good" and check.name == "app ring" and check.passed
    [f] = check.findings
    assert f.code == "app-check" and f.severity == "info"
    assert "exit 0 in 3.2 s, 2 rank(s) on 2 node(s)" in f.message and "expected output: ranks=2 spiked=10" in f.message


def test_failures_are_bad_and_quote_the_log(tmp_path: Path) -> None:
    cases = [
        (
            1,
            False,
            "Traceback (most recent call last):\nModuleNotFoundError: No module named 'arbor'\n",
            "exited with code 1",
            "ModuleNotFoundError: No module named 'arbor'",
        ),
        (0, False, "ranks=1 spiked=10\n", r"exited 0 but its output lacks /ranks=2 spiked=\d+/", "ranks=1 spiked=10"),
        (124, True, "still running\n", "did not finish within 60 s", "still running"),
    ]
    for rc, timed_out, text, problem, quoted in cases:
        check = judge(APP, rc, timed_out, 1.0, _log(tmp_path, text), "raw/apps/ring.log")
        assert check.verdict == "bad" and not check.passed, problem
        [f] = check.findings
        assert f.code == "app-check-failed" and f.severity == "error"
        assert f.message == f"app ring (2 rank(s) on 2 node(s)) {problem}; log raw/apps/ring.log"
        assert quoted in f.evidence and f.evidence[-1] == "log: raw/apps/ring.log"
        assert not any(e.startswith(("#@", "$ ")) for e in f.evidence)  # dedal's own header lines are not quoted
        assert overall_verdict([check]) == "bad"


def test_the_expected_output_is_not_matched_in_the_command_line(tmp_path: Path) -> None:
    """The log's header names the command; an app that printed nothing must not pass on it."""
    app = AppCheck(name="echo", command=["sh", "-c", "true ranks=2 spiked=3"], expect=r"ranks=2 spiked=\d+")
    log = tmp_path / "echo.log"
    log.write_text("#@ note\n$ mpirun -n 2 sh -c 'true ranks=2 spiked=3'\n")
    assert judge(app, 0, False, 0.1, log, "raw/apps/echo.log").verdict == "bad"
    script = "import sys\nprint('ranks=2 spiked=3')\n"  # a multi-line script: its header spans lines
    app = AppCheck(name="py", command=["python3", "-c", script], expect=r"ranks=2 spiked=\d+")
    log.write_text(f"#@ note\n$ mpirun -n 2 python3 -c '{script}'\n")
    assert judge(app, 0, False, 0.1, log, "raw/apps/py.log").verdict == "bad"
    log.write_text(f"#@ note\n$ mpirun -n 2 python3 -c '{script}'\nranks=2 spiked=3\n")
    assert judge(app, 0, False, 0.1, log, "raw/apps/py.log").verdict == "good"


def test_no_expected_output_passes_on_exit_0(tmp_path: Path) -> None:
    app = AppCheck(name="true", command=["true"])
    assert judge(app, 0, False, 0.1, _log(tmp_path, ""), "raw/apps/true.log").verdict == "good"
    assert judge(app, 2, False, 0.1, _log(tmp_path, ""), "raw/apps/true.log").verdict == "bad"


def test_more_nodes_than_the_run_has_is_a_skip_not_a_pass() -> None:
    assert skip_reason(APP, "srun", 2) == ""
    assert skip_reason(APP, "srun", 1) == "needs 2 nodes, the run has 1"
    assert skip_reason(APP, "mpirun", 1) == "needs 2 nodes (srun inside a Slurm allocation)"
    assert skip_reason(AppCheck(name="one", command=["true"]), "mpirun", 1) == ""


def test_a_gpu_app_where_no_gpu_is_used_is_a_gpu_skip(tmp_path: Path) -> None:
    """An app that needs a GPU (a CUDA build of Arbor stops at start-up without a device) on a
    run that uses none: skipped with the run's reason, counted among the GPU checks, never run
    (no root, no launcher: anything run would fail); with the GPU in use it is planned."""
    gpu_app = AppCheck(name="ring-gpu", command=["busyring", "ring.json"], ranks=1, nodes=1, gpu=True)
    assert skip_reason(gpu_app, "srun", 2, "no GPU") == "no GPU"
    assert skip_reason(gpu_app, "srun", 2, "") == ""
    assert skip_reason(APP, "srun", 2, "no GPU") == ""  # a CPU app runs whatever the GPU
    [check] = run_apps(
        [gpu_app],
        root=None,
        launcher="srun",
        nodes=2,
        outdir=tmp_path,
        runtime_name="apptainer",
        env={},
        no_gpu="no GPU",
    )
    assert check.skipped and check.gpu and check.skip_reason == "no GPU"
    assert skipped_text([check]) == "GPU checks skipped: no GPU"
    assert not (tmp_path / "raw").exists()


def test_the_images_own_test_is_judged_by_its_last_line_where_dedal_wrote_it(tmp_path: Path) -> None:
    ours = apps.own_test({"dedal.env": "demo"})
    assert ours.name == "apptainer-test" and ours.command == ["/.singularity.d/actions/test"]
    log = tmp_path / "own.log"
    log.write_text("$ /.singularity.d/actions/test\nok    Open MPI v5.0.7 runs\ndemo:latest: all 5 checks passed\n")
    assert apps.judge(ours, 0, False, 0.7, log, "raw/apps/apptainer-test.log").verdict == "good"
    log.write_text("$ /.singularity.d/actions/test\nok    Open MPI v5.0.7 runs\n")  # stopped before its end
    assert apps.judge(ours, 0, False, 0.7, log, "raw/apps/apptainer-test.log").verdict == "bad"
    # another image's %test (apptainer build): its exit code alone
    theirs = apps.own_test({"org.label-schema.usage": "/.singularity.d/runscript.help"})
    assert theirs.expect == ""
    assert apps.judge(theirs, 0, False, 0.1, log, "raw/apps/apptainer-test.log").verdict == "good"
    assert apps.judge(theirs, 1, False, 0.1, log, "raw/apps/apptainer-test.log").verdict == "bad"
