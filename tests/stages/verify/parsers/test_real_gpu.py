"""Issue 36: the esd-gpu image's own binaries on a real NVIDIA H200, recorded for dedal
(``data/real/gpu/``, byte for byte from ``../shared/data/gpu-h200``; its README.md says how and
when). Each file gets the verdict a person reading it gives, with the finding that says why,
quoting lines of the file: not FAILED on PRRTE's help text or a table limited by ``-m`` (the two
false alarms), and BAD for the ~150 us between GPU buffers that native vs container could not see.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dedal.stages.verify.parsers import parse_file

GPU = Path(__file__).resolve().parents[1] / "data" / "real" / "gpu"  # tests/stages/verify/data/real/gpu

# file -> (verdict, the finding that proves it; None: nothing to find)
EXPECTED = {
    "dedal-latency.txt": ("good", "ompi-component-optional"),
    "osu-bw-HH.txt": ("good", "ompi-component-optional"),
    "run2-C-osu-lat-HH.txt": ("good", "table-range-unknown"),
    "osu-bw-DD.txt": ("good", "ompi-component-optional"),
    "run2-C-osu-bw-DD.txt": ("good", "ompi-component-optional"),
    "run2-B-lat-all.txt": ("bad", "device-latency-slow"),
    "run2-B-lat-nomemtypecache.txt": ("bad", "device-latency-slow"),
    "run2-C-osu-lat-DD.txt": ("bad", "device-latency-slow"),
    "osu-allreduce-D.txt": ("suboptimal", "device-collective-slow"),
    "run2-C-osu-allreduce-D.txt": ("suboptimal", "device-collective-slow"),
    "osu-bw-DD-noipc.txt": ("failed", "pml-unavailable"),
    "run2-A-perf-debug.txt": ("bad", "device-latency-slow"),
    "run2-C-perf-lat.txt": ("bad", "device-latency-slow"),
    "run1-log": ("failed", "pml-unavailable"),
    "nccl-host-1rank.txt": ("degenerate", "degenerate"),
    "ompi-info.txt": ("unknown", None),
}


def test_every_recording_is_listed_with_its_source() -> None:
    present = {p.name for p in GPU.iterdir() if p.name != "README.md"}
    assert present == set(EXPECTED)
    readme = (GPU / "README.md").read_text()
    assert "../shared/data/gpu-h200" in readme and "2026-11-27" in readme and "H200" in readme
    for name, (verdict, _code) in EXPECTED.items():
        row = next((ln for ln in readme.splitlines() if ln.startswith("| ") and f"`{name}`" in ln), "")
        assert f"**{verdict}**" in row, name  # the README's table says the same verdict


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_is_judged_as_an_expert_would(name: str) -> None:
    verdict, code = EXPECTED[name]
    result = parse_file(GPU / name)
    assert result["verdict"] == verdict, [(f["code"], f["verdict"]) for f in result["findings"]]
    if code is None:
        assert result["findings"] == []
        return
    proof = [f for f in result["findings"] if f["code"] == code]
    assert proof, [f["code"] for f in result["findings"]]
    assert proof[0]["verdict"] == verdict or proof[0]["severity"] == "info"
    # a table row is quoted as parsed (its values one blank apart)
    text = " ".join((GPU / name).read_text(errors="replace").split())
    assert proof[0]["evidence"] and all(" ".join(line.split()) in text for line in proof[0]["evidence"])


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if n != "ompi-info.txt"))
def test_no_false_alarm_of_issue_36(name: str) -> None:
    """PRRTE's help text about plm isolated is a note; no table of a file without its command
    line is called truncated (run1-log's are: `head -60` cut them, after their command lines)."""
    result = parse_file(GPU / name)
    assert "ompi-component-missing" not in [f["code"] for f in result["findings"]]
    cut = [f for f in result["findings"] if f["code"] == "truncated"]
    if name == "run1-log":
        assert len(cut) == 5 and all(f["evidence"][0].startswith("== prterun") for f in cut)
    else:
        assert cut == []


@pytest.mark.parametrize(
    "name, value",
    [
        ("run2-B-lat-all.txt", 151.43),
        ("run2-B-lat-nomemtypecache.txt", 155.39),
        ("run2-C-osu-lat-DD.txt", 157.93),
        ("run2-A-perf-debug.txt", 154.589),
        ("run2-C-perf-lat.txt", 155.15),
    ],
)
def test_the_150_us_between_gpu_buffers_is_named(name: str, value: float) -> None:
    (slow,) = [f for f in parse_file(GPU / name)["findings"] if f["code"] == "device-latency-slow"]
    assert f"take {value:g} us" in slow["message"] and "GPU buffers" in slow["message"]


def test_ucx_perftest_reads_its_test_size_and_memory() -> None:
    debug = parse_file(GPU / "run2-A-perf-debug.txt")  # UCX's DEBUG log names the command line
    assert debug["kind"] == "ucx-perftest" and debug["perftest"] == {"test": "tag_lat", "size": 8, "memory": "cuda"}
    alone = parse_file(GPU / "run2-C-perf-lat.txt")  # no command line: UCX's note and bandwidth / message rate
    assert alone["perftest"] == {"test": None, "size": 8, "memory": "cuda"} and alone["ucx_version"] == "1.18.1"


def test_the_console_log_holds_every_run() -> None:
    r = parse_file(GPU / "run1-log")
    tables = [(t["benchmark"], t["device"], t["rows"][-1][0]) for t in r["tables"]]
    assert tables == [
        ("osu_latency", "cuda", 262144),
        ("osu_bw", "cuda", 32768),
        ("osu_latency", None, 2097152),
        ("osu_bw", None, 2097152),
        ("osu_allreduce", "cuda", 32768),
        ("dedal_latency", None, 65536),
        ("ucx_perftest_tag_lat", "cuda", 8),
        ("ucx_perftest_tag_bw", "cuda", 4194304),
        ("ucx_perftest_tag_lat", None, 8),
    ]
    vs_host = [f for f in r["findings"] if f["code"] == "device-latency-vs-host"]
    assert vs_host and all(re.search(r"\d+x the 0.289 us between host buffers", f["message"]) for f in vs_host)
    assert any(f["code"] == "ucx-memory-hooks-off" for f in r["findings"])
