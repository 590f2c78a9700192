"""Expectations per hardware class, declared as rows and judged once (issue 36, item 3): a
stack as slow natively as in the container is reported, with the reason."""

from __future__ import annotations

import dataclasses

import pytest

from dedal.stages.verify import expectations as E
from dedal.stages.verify.expectations import Fact
from dedal.stages.verify.parsers import parse_text


def fact(key: str, value: float, subject: str = "osu_latency", line: str = "") -> Fact:
    hardware, name = key.split(":")
    return Fact(hardware, name, subject, value, E.FACTS[key][0], (line or f"8 {value}",))


def codes(findings) -> list:
    return [f.code for f in findings]


def test_the_table_is_consistent() -> None:
    assert E.check_table() == []
    assert len({r.code for r in E.EXPECTATIONS}) == len(E.EXPECTATIONS) == len(E.CODES)


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"fact": "latency_tiny_us"}, "not a fact"),
        ({"of": "cuda:nothing"}, "not a fact"),
        ({"at_least": None, "below": None}, "no range"),
        ({"at_least": 5.0, "below": 5.0}, "empty range"),
        ({"severity": "fatal"}, "severity"),
        ({"message": "{subject} {ratio}"}, "message"),
    ],
)
def test_a_wrong_row_is_named(change, problem) -> None:
    row = dataclasses.replace(E.EXPECTATIONS[0], **change)
    (found,) = E.check_table([row])
    assert found.startswith(f"{row.code}:") and problem in found


def test_the_h200_device_latency_is_reported_without_a_floor() -> None:
    """dedal verify parse of one OSU -d cuda table: no floor measured, the class bound judges."""
    found = E.judge([fact("cuda:latency_small_us", 151.43, line="8 151.43")])
    (slow,) = found
    assert (slow.code, slow.severity, slow.implied_verdict) == ("device-latency-slow", "error", "bad")
    assert "151.43 us" in slow.message and slow.evidence == ["8 151.43"]
    (high,) = E.judge([fact("cuda:latency_small_us", 30.0)])
    assert (high.code, high.severity) == ("device-latency-high", "warning")
    assert E.judge([fact("cuda:latency_small_us", 3.1)]) == []


def test_against_the_same_hosts_host_buffers() -> None:
    found = E.judge(
        [
            fact("cuda:latency_small_us", 151.43),
            fact("host:latency_small_us", 0.35, "dedal_latency"),
            fact("host:latency_small_us", 0.41, "osu_latency"),
        ]
    )
    vs = next(f for f in found if f.code == "device-latency-vs-host")
    assert vs.severity == "warning" and "433x the 0.35 us" in vs.message and "dedal_latency" in vs.message
    assert vs.evidence == ["8 151.43", "8 0.35"]  # the fact's line and its reference's
    assert "device-latency-vs-host" not in codes(
        E.judge([fact("cuda:latency_small_us", 30.0), fact("host:latency_small_us", 0.35)])
    )


def test_against_the_platforms_own_floor() -> None:
    """With dedal's CUDA IPC ping-pong measured, it judges (the class bound is moot)."""
    floor = [fact("cuda:ipc_latency_us", 18.0, "dedal_cuda_floor"), fact("cuda:copy_sync_us", 15.0, "dedal_cuda_floor")]
    found = E.judge([fact("cuda:latency_small_us", 151.43)] + floor, scope="intra-node")
    assert codes(found) == ["device-latency-vs-floor"]
    assert found[0].implied_verdict == "bad" and "8.4x" in found[0].message and "18 us" in found[0].message
    assert E.judge([fact("cuda:latency_small_us", 30.0)] + floor, scope="intra-node") == []  # within 2x
    # a platform whose own floor is slow: the stack within 2x of it is not blamed
    assert E.judge([fact("cuda:latency_small_us", 120.0), fact("cuda:ipc_latency_us", 70.0)]) == []
    # between nodes a CUDA IPC floor says nothing: the class bound judges there
    assert codes(E.judge([fact("cuda:latency_small_us", 151.43)] + floor, scope="inter-node")) == []


def test_against_one_cuda_copy_where_ipc_is_not_measured() -> None:
    found = E.judge([fact("cuda:latency_small_us", 151.43), fact("cuda:copy_sync_us", 15.0, "dedal_cuda_floor")])
    assert codes(found) == ["device-latency-vs-copy"] and "10.1x" in found[0].message


def test_device_bandwidth_against_the_cuda_copy() -> None:
    copy = fact("cuda:copy_bandwidth_mbs", 800000.0, "dedal_cuda_copy_bandwidth", "4194304 800000.0")
    (low,) = E.judge([fact("cuda:bandwidth_large_mbs", 396560.0, "osu_bw"), copy])
    assert (low.code, low.severity) == ("device-bandwidth-vs-copy", "warning") and "50%" in low.message
    assert E.judge([fact("cuda:bandwidth_large_mbs", 760000.0, "osu_bw"), copy]) == []


def test_judge_by_hardware_class() -> None:
    both = [fact("cuda:latency_small_us", 151.43), fact("host:latency_small_us", 40.0)]
    assert codes(E.judge(both)) == ["latency-tcp-like", "device-latency-slow"]
    assert codes(E.judge(both, hardware=["cuda"])) == ["device-latency-slow"]


def test_facts_of_osu_tables() -> None:
    text = (
        "# OSU MPI-CUDA Latency Test v7.4\n# Size       Avg Latency(us)\n1   154.63\n8   151.43\n64   154.85\n"
        "128   153.92\n# OSU MPI Latency Test v7.4\n# Size       Avg Latency(us)\n1   0.41\n2   0.40\n"
        "# OSU MPI-CUDA Bandwidth Test v7.4\n# Size      Bandwidth (MB/s)\n1048576   350000.5\n4194304   396560.0\n"
        "# OSU MPI Allreduce Latency Test v7.4\n# Size       Avg Latency(us)\n4   240.0\n8   241.0\n"
    )
    facts = {(f.key, f.subject): f for f in E.facts_of(parse_text(text))}
    assert set(facts) == {
        ("cuda:latency_small_us", "osu_latency"),
        ("host:latency_small_us", "osu_latency"),
        ("cuda:bandwidth_large_mbs", "osu_bw"),
    }  # a collective is no point-to-point fact
    assert facts[("cuda:latency_small_us", "osu_latency")].value == 151.43
    assert facts[("cuda:latency_small_us", "osu_latency")].evidence == ("8 151.43",)
    assert facts[("cuda:bandwidth_large_mbs", "osu_bw")].value == 396560.0


def test_a_slow_collective_between_gpu_buffers() -> None:
    """The H200's osu_allreduce -d cuda: 190-260 us for small messages of two ranks."""
    text = "# OSU MPI-CUDA Allreduce Latency Test v7.4\n# Size       Avg Latency(us)\n4   191.8\n8   192.5\n"
    r = parse_text(text)
    (f,) = [f for f in r["findings"] if f["code"] == "device-collective-slow"]
    assert f["severity"] == "warning" and "191.8 us" in f["message"] and r["verdict"] == "suboptimal"
    assert E.judge([fact("cuda:collective_small_us", 40.0, "osu_allreduce")]) == []


def test_facts_of_the_floor_benchmark() -> None:
    text = (
        "# dedal-bench CUDA Floor Test v1.1\n# GPU 0 of 1: NVIDIA H200 (sm_90), CUDA driver 13.0\n"
        "# Size      IPC Latency(us)     D2H+sync(us)     D2D+sync(us)\n"
        "1    19.50    15.10    12.20\n8    18.90    14.80    12.10\n128    19.70    15.00    12.30\n"
        "# dedal-bench CUDA Copy Bandwidth Test v1.1\n# Size      Bandwidth (MB/s)\n"
        "1048576    600000.00\n4194304    800000.00\n"
    )
    facts = {f.key: f for f in E.facts_of(parse_text(text))}
    assert set(facts) == {"cuda:ipc_latency_us", "cuda:copy_sync_us", "cuda:copy_bandwidth_mbs"}
    assert (facts["cuda:ipc_latency_us"].value, facts["cuda:copy_sync_us"].value) == (18.9, 14.8)
    assert facts["cuda:copy_bandwidth_mbs"].value == 800000.0
    # IPC unavailable: its column says "-", and there is no IPC fact
    text2 = text.replace("1    19.50", "1    -").replace("8    18.90", "8    -").replace("128    19.70", "128    -")
    assert "cuda:ipc_latency_us" not in {f.key for f in E.facts_of(parse_text(text2))}


def test_median_of_the_repetitions() -> None:
    runs = [[fact("cuda:latency_small_us", v, line=f"8 {v}")] for v in (150.0, 160.0, 152.0)]
    (m,) = E.median_facts(runs, ["a.log", "b.log", "c.log"])
    assert m.value == 152.0 and m.evidence == ("8 152.0", "log: c.log", "median of 3 run(s)")


def test_a_host_tcp_latency_keeps_its_finding() -> None:
    """The rules moved from the OSU parser into the table say what they said."""
    r = parse_text("# OSU MPI Latency Test v7.4\n# Size       Avg Latency(us)\n1   38.25\n2   38.4\n")
    (f,) = [f for f in r["findings"] if f["code"] == "latency-tcp-like"]
    assert f["severity"] == "error" and f["message"].startswith("osu_latency: small-message latency 38.25 us")
    assert f["evidence"] == ["1 38.25"]
