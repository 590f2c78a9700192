"""The Slurm adapter's pure-Python parts: state mapping, output parsing, templates.

Output samples are real Slurm 22.05 output from the test cluster (and the 23.02+ JSON
shapes from Slurm's OpenAPI documentation). No daemons are started here.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dedal.adapters import slurm
from dedal.adapters.slurm import JobState, Node, Slurm, State
from dedal.adapters.slurm.reports import exit_pair as _exit_pair, wait_status as _wait_status
from dedal.errors import UserError


@pytest.mark.parametrize(
    "text, state",
    [
        ("PENDING", State.PENDING),
        ("PD", State.PENDING),
        ("REQUEUED", State.PENDING),
        ("CONFIGURING", State.PENDING),
        ("SUSPENDED", State.PENDING),
        ("RUNNING", State.RUNNING),
        ("COMPLETING", State.RUNNING),
        ("CG", State.RUNNING),
        ("COMPLETED", State.COMPLETED),
        ("FAILED", State.FAILED),
        ("SPECIAL_EXIT", State.FAILED),
        ("CANCELLED by 0", State.CANCELLED),
        ("CANCELLED+", State.CANCELLED),
        ("TIMEOUT", State.TIMEOUT),
        ("DEADLINE", State.TIMEOUT),
        ("NODE_FAIL", State.NODE_FAIL),
        ("PREEMPTED", State.PREEMPTED),
        ("BOOT_FAIL", State.BOOT_FAIL),
        ("OUT_OF_MEMORY", State.OUT_OF_MEMORY),
        ("OOM", State.OUT_OF_MEMORY),
        ("WHATEVER", State.UNKNOWN),
        (None, State.UNKNOWN),
        (["PENDING", "REQUEUED"], State.PENDING),
        (["FAILED"], State.FAILED),
        ([], State.UNKNOWN),
    ],
)
def test_state_mapping(text, state) -> None:
    assert State.from_slurm(text) is state


def test_node_failures_are_only_the_machine_ones() -> None:
    assert {s for s in State if s.is_node_failure} == {State.NODE_FAIL, State.PREEMPTED, State.BOOT_FAIL}
    assert {s for s in State if s.is_active} == {State.PENDING, State.RUNNING}
    assert not State.UNKNOWN.is_finished and State.CANCELLED.is_finished


def test_exit_codes() -> None:
    # squeue --json of 22.05: the raw wait status; 23.02+: an object
    assert _wait_status(0) == (0, None)
    assert _wait_status(768) == (3, None)
    assert _wait_status(9) == (None, 9)
    assert _wait_status(
        {
            "status": ["ERROR"],
            "return_code": {"set": True, "infinite": False, "number": 3},
            "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""},
        }
    ) == (3, None)
    assert _wait_status(
        {
            "status": ["SIGNALED"],
            "return_code": {"set": True, "number": 0},
            "signal": {"id": {"set": True, "number": 9}, "name": "KILL"},
        }
    ) == (None, 9)
    assert _wait_status(None) == (None, None)
    # sacct ExitCode
    assert _exit_pair("3:0") == (3, None)
    assert _exit_pair("0:9") == (None, 9)
    assert _exit_pair("") == (None, None)


SQUEUE_JSON_2205 = {
    "meta": {},
    "errors": [],
    "jobs": [
        {
            "job_id": 7,
            "job_state": "FAILED",
            "state_reason": "NonZeroExitCode",
            "exit_code": 768,
            "batch_host": "node1",
            "nodes": "node1",
        },
        {
            "job_id": 8,
            "job_state": "CANCELLED",
            "state_reason": "DependencyNeverSatisfied",
            "exit_code": 0,
            "batch_host": "",
            "nodes": "",
        },
        {
            "job_id": 9,
            "job_state": "PENDING",
            "state_reason": "Dependency",
            "exit_code": 0,
            "batch_host": "",
            "nodes": "",
        },
        {
            "job_id": 10,
            "job_state": "RUNNING",
            "state_reason": "None",
            "exit_code": 0,
            "batch_host": "node2",
            "nodes": "node2",
        },
    ],
}


def test_parse_squeue_json_filters_ids_itself() -> None:
    # 22.05 ignores -j together with --json
    got = Slurm._parse_squeue_json(json.dumps(SQUEUE_JSON_2205), {"7", "9", "10"})
    assert set(got) == {"7", "9", "10"}
    assert got["7"] == JobState(State.FAILED, 3, "node1", "NonZeroExitCode", None, "squeue")
    assert got["9"].state is State.PENDING and got["9"].exit_code is None and got["9"].reason == "Dependency"
    assert got["10"] == JobState(State.RUNNING, None, "node2", "", None, "squeue")


def test_parse_sacct_takes_last_row_of_requeued_job() -> None:
    text = "12|NODE_FAIL|0:0|node3\n12|COMPLETED|0:0|node1\n13|FAILED|0:9|node2\n14|CANCELLED by 0|0:0|None assigned\n"
    got = Slurm._parse_sacct(text, {"12", "13", "14"}, "sacct -c")
    assert got["12"].state is State.COMPLETED and got["12"].node == "node1"
    assert got["13"] == JobState(State.FAILED, None, "node2", "", 9, "sacct -c")
    assert got["14"].state is State.CANCELLED and got["14"].node == ""


def test_jobstate_json_round_trip() -> None:
    st = JobState(State.NODE_FAIL, None, "node3", "NodeDown", None, "squeue")
    assert JobState.from_json(json.loads(json.dumps(st.to_json()))) == st


def test_node_usable() -> None:
    assert Node("n", 2, "idle").usable and Node("n", 2, "mixed").usable and Node("n", 2, "allocated").usable
    assert not Node("n", 2, "idle*").usable
    assert not Node("n", 2, "down").usable and not Node("n", 2, "drained").usable


def test_default_template_renders_and_runs(tmp_path: Path) -> None:
    text = slurm.default_template().read_text()
    out = slurm.render_job_script(
        text,
        {
            "job_name": "dedal-zlib-1.3",
            "packages": "zlib@1.3 xz@5.4",
            "command": "echo built in $DEDAL_STAGE_DIR",
            "log": "'/tmp/a b.log'",
            "stage_dir": "/dev/shm",
        },
    )
    assert "{{" not in "".join(ln for ln in out.splitlines() if not ln.startswith("#"))
    assert "#   {{command}}" in out  # the documentation comment is left alone
    script = tmp_path / "job.sh"
    script.write_text(out)
    res = subprocess.run(
        ["bash", str(script)],
        text=True,
        capture_output=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "DEDAL_STAGE_DIR": str(tmp_path)},
    )
    assert res.returncode == 0, res.stderr
    assert f"built in {tmp_path}" in res.stdout
    assert "dedal: packages: zlib@1.3 xz@5.4" in res.stdout
    assert "dedal: log: /tmp/a b.log" in res.stdout
    assert "exit=0" in res.stdout


def test_template_failure_keeps_exit_code(tmp_path: Path) -> None:
    out = slurm.render_job_script(
        slurm.default_template().read_text(),
        {"job_name": "j", "packages": "p", "command": "(exit 5)", "log": "l", "stage_dir": "/dev/shm"},
    )
    res = subprocess.run(["bash", "-c", out], text=True, capture_output=True, timeout=30)
    assert res.returncode == 5 and "exit=5" in res.stdout


def test_template_unknown_placeholder_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"\{\{nodes\}\}.*known: \{\{command\}\}"):
        slurm.render_job_script(
            "#!/bin/bash\n#SBATCH --nodes={{nodes}}\n{{command}}\n", {"command": "true"}, source="site.sh.in"
        )
    # bash's own braces and $@ are not placeholders
    assert (
        slurm.render_job_script('f() { echo "${1}" "$@"; }\n{{ command }}\n', {"command": "f x"})
        == 'f() { echo "${1}" "$@"; }\nf x\n'
    )


def test_missing_slurm_is_tool_missing(tmp_path: Path) -> None:
    from dedal.errors import ToolMissing

    client = Slurm({"PATH": str(tmp_path)})
    with pytest.raises(ToolMissing, match="slurm-client"):
        client.nodes()


@pytest.mark.parametrize(
    "text, minutes",
    [
        ("04:00:00", 240),
        ("240", 240),
        ("90:30", 91),
        ("0:30", 1),
        ("48:00:00", 2880),
        ("1-00:00:00", 1440),
        ("2-3", 3060),
        ("1-1:30", 1530),
        ("1-0:0:1", 1441),
        ("", None),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_time_limits_in_slurm_formats(text, minutes) -> None:
    assert slurm.time_minutes(text) == minutes
    if minutes:
        assert slurm.time_minutes(slurm.time_text(minutes)) == minutes


@pytest.mark.parametrize("text", ["4h", "1:2:3:4", "a-1", "-5", "1--2", "1-2:3:4:5", "12:xx"])
def test_time_limit_not_in_a_slurm_format(text) -> None:
    with pytest.raises(ValueError, match="not a Slurm time limit"):
        slurm.time_minutes(text)


def test_job_time_limit_from_its_estimate() -> None:
    from dedal.stages.building.executors.slurm import job_time_limit

    assert job_time_limit(300.0, 2.0, "04:00:00") == "0:10:00"
    assert job_time_limit(301.0, 2.0, "04:00:00") == "0:11:00"  # whole minutes, rounded up
    assert job_time_limit(5.0, 2.0, "04:00:00") == "0:01:00"  # at least one
    assert job_time_limit(7200.0, 2.0, "04:00:00") == "04:00:00"  # never above slurm.time
    assert job_time_limit(9000.0, 2.0, "04:00:00") == "04:00:00"
    assert job_time_limit(9000.0, 2.0, "") == "5:00:00"  # no cap: the estimate's
    assert job_time_limit(300.0, 0.0, "04:00:00") == "04:00:00"  # factor 0: slurm.time as it is
    assert job_time_limit(300.0, 0.0, "whatever") == "whatever"
    with pytest.raises(UserError, match="slurm.time: not a Slurm time limit: '4h'"):
        job_time_limit(300.0, 2.0, "4h")
