"""A missing or broken Slurm configuration is one clear error, not Slurm's DNS SRV lines."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from dedal.adapters.slurm import Slurm, conf
from dedal.errors import DedalError, UserError

DATA = Path(__file__).parent / "data"


def _fake_slurm(tmp_path: Path, recorded: str) -> dict:
    """sinfo and squeue that print a recorded real output on stderr and exit 1."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sinfo", "squeue", "sacct", "sbatch"):
        exe = bin_dir / tool
        exe.write_text(
            f"#!{sys.executable}\nimport sys\nsys.stderr.write(open({str(DATA / recorded)!r}).read())\nsys.exit(1)\n"
        )
        exe.chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def test_no_configuration_names_the_fix_not_dns(tmp_path):
    with pytest.raises(conf.SlurmNotConfigured) as info:
        Slurm(_fake_slurm(tmp_path, "no-config.sinfo.txt")).nodes()
    msg = info.value.one_line()
    assert msg.startswith("no Slurm configuration: SLURM_CONF is not set")
    assert "set SLURM_CONF to the cluster's slurm.conf" in msg and "res_nsearch" not in msg
    assert isinstance(info.value, UserError) and info.value.exit_code == 2


def test_unchecked_commands_explain_too(tmp_path):
    # states() runs squeue with check=False and looks at the output itself
    with pytest.raises(conf.SlurmNotConfigured):
        Slurm(_fake_slurm(tmp_path, "no-config.sinfo.txt")).states(["12"])


def test_broken_configuration_quotes_slurms_reasons(tmp_path):
    env = _fake_slurm(tmp_path, "bad-config.sinfo.txt")
    env["SLURM_CONF"] = str(tmp_path / "slurm.conf")
    (tmp_path / "slurm.conf").write_text("ClusterName=x\nBogusKey=1\n")
    with pytest.raises(conf.SlurmNotConfigured) as info:
        Slurm(env).nodes()
    assert info.value.one_line().startswith(
        f"Slurm cannot use its configuration {tmp_path / 'slurm.conf'} (_parse_next_key: Parsing error at "
        "unrecognized key: BogusKey; No SlurmctldHost defined.)"
    )


def test_controller_down(tmp_path):
    env = _fake_slurm(tmp_path, "controller-down.sinfo.txt")
    with pytest.raises(conf.SlurmUnavailable) as info:
        Slurm(env).nodes()
    assert "slurmctld" in info.value.one_line() and "does not answer" in info.value.one_line()
    assert not isinstance(info.value, UserError)


def test_slurm_conf_naming_no_file_fails_before_any_command(tmp_path):
    # no sinfo on PATH at all: the check comes first (Slurm itself retries for 60 s)
    env = {"PATH": str(tmp_path), "SLURM_CONF": str(tmp_path / "nope.conf")}
    with pytest.raises(conf.SlurmNotConfigured) as info:
        Slurm(env).nodes()
    assert info.value.one_line() == (f"SLURM_CONF={tmp_path / 'nope.conf'}: no such file; {conf.FIX}")


def test_other_failures_are_left_alone():
    assert conf.explain("squeue: error: Invalid job id specified", {}) is None


@pytest.mark.skipif(
    not shutil.which("sinfo") or conf.DEFAULT_CONF.exists(),
    reason="needs Slurm's commands and no /etc/slurm/slurm.conf",
)
def test_real_sinfo_without_configuration():
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    with pytest.raises(DedalError) as info:
        Slurm(env).nodes()
    assert isinstance(info.value, conf.SlurmNotConfigured), info.value.one_line()
