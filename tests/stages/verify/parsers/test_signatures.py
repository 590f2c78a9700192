"""Open MPI's component help text read whole (issue 36): the component it names decides
whether it is a failure or a note."""

from __future__ import annotations

from pathlib import Path

from dedal.stages.verify.parsers import parse_text
from dedal.stages.verify.parsers import signatures
from dedal.stages.verify.parsers.signatures import scan

HELP = """--------------------------------------------------------------------------
A requested component was not found, or was unable to be opened.  This
means that this component is either not installed or is unable to be
used on your system (e.g., sometimes this means that shared libraries
that the component requires are unable to be found/loaded).  Note that
{who} stopped checking at the first component that it did not find.

Host:      vm
Framework: {framework}
Component: {component}
--------------------------------------------------------------------------
"""
TABLE = "# OSU MPI Latency Test v7.4\n# Size       Avg Latency(us)\n" + "".join(
    f"{1 << i:<10}{0.4:>18.2f}\n" for i in range(23)
)


def test_the_help_text_names_framework_and_component() -> None:
    lines = HELP.format(who="PMIx", framework="plm", component="isolated").splitlines()
    assert signatures.missing_components(lines) == [
        (
            "plm",
            "isolated",
            [
                "A requested component was not found, or was unable to be opened.  This",
                "Framework: plm",
                "Component: isolated",
            ],
        )
    ]


def test_prrte_asked_for_open_mpi_4s_isolated_launcher_is_a_note() -> None:
    """The H200 recordings: PRRTE prints this for plm isolated before every run, and every run
    completes (the issue's first false alarm: taken for a missing MPI component, FAILED)."""
    text = 2 * HELP.format(who="PMIx", framework="plm", component="isolated") + TABLE
    r = parse_text(text)
    assert r["verdict"] == "good"
    (note,) = [f for f in r["findings"] if f["code"] == "ompi-component-optional"]
    assert note["severity"] == "info" and "isolated" in note["message"] and "plm" in note["message"]
    assert "2 help text(s)" in note["message"]
    assert note["evidence"] == [
        "A requested component was not found, or was unable to be opened.  This",
        "Framework: plm",
        "Component: isolated",
    ]
    assert ("plm", "isolated") in signatures.OPTIONAL_COMPONENTS


def test_a_missing_pml_stays_a_failure_and_is_named() -> None:
    text = HELP.format(who="Open MPI", framework="plm", component="isolated") + HELP.format(
        who="Open MPI", framework="pml", component="ucx"
    )
    found = {f.code: f for f in scan(text.splitlines())}
    missing = found["ompi-component-missing"]
    assert missing.implied_verdict == "failed" and missing.message.endswith(": pml ucx")
    assert missing.evidence[1:] == ["Framework: pml", "Component: ucx"]
    assert found["ompi-component-optional"].severity == "info"


def test_a_help_text_without_its_names_stays_a_failure() -> None:
    (f,) = scan(["A requested component was not found, or was unable to be opened.  This"])
    assert f.code == "ompi-component-missing" and f.implied_verdict == "failed"


def test_a_gpu_driver_not_loaded_where_no_gpu_is_used_is_expected() -> None:
    """A real run of the esd-gpu image's dedal_init on a host without NVIDIA driver: Open MPI's
    CUDA components cannot load libcuda and go on without it. On a host (run) without GPUs that
    is expected (good); where the run uses GPUs the driver is missing inside (failed); with no
    host known, as `dedal verify parse` of the log alone, it cannot be told and stays failed."""
    from dedal.stages.verify.facts import HostFacts
    from dedal.stages.verify.parsers import parse_file

    log = Path(__file__).parent.parent / "data" / "no_gpu_host" / "esd-gpu-dedal-init.log"
    none = parse_file(log, host=HostFacts(gpus=0), scope="intra-node")
    codes = {f["code"]: f for f in none["findings"]}
    assert none["verdict"] == "good" and codes["cuda-driver-absent"]["severity"] == "info", none["findings"]
    assert "nv-libraries-missing" not in codes
    used = parse_file(log, host=HostFacts(gpus=1), scope="intra-node")
    assert used["verdict"] == "failed" and "nv-libraries-missing" in {f["code"] for f in used["findings"]}
    assert parse_file(log)["verdict"] == "failed"
