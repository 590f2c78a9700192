"""ucx_perftest output: the final row as a table with its test, size and memory type."""

from __future__ import annotations

from dedal.stages.verify.parsers import parse_text

HEAD = """+--------------+--------------+------------------------------+---------------------+-----------------------+
|              |              |        {what} (usec)        |   bandwidth (MB/s)  |  message rate (msg/s) |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
|    Stage     | # iterations | 50.0%ile | average | overall |  average |  overall |  average  |  overall  |
+--------------+--------------+----------+---------+---------+----------+----------+-----------+-----------+
"""


def test_a_bandwidth_test_in_osu_units() -> None:
    text = (
        "$ ucx_perftest 127.0.0.1 -t tag_bw -s 4194304 -n 500 -m cuda\n"
        + HEAD.format(what="overhead")
        + "Final:                   500      0.854     9.434     9.434   423988.27  423988.27      105997      105997\n"
    )
    r = parse_text(text)
    (t,) = r["tables"]
    assert r["kind"] == "ucx-perftest" and r["verdict"] == "good"
    assert (t["benchmark"], t["device"], t["metric"], t["unit"]) == ("ucx_perftest_tag_bw", "cuda", "bandwidth", "MB/s")
    assert t["rows"] == [[4194304, 444583.92]]  # UCX's MB is 2^20 bytes, OSU's 10^6


def test_host_memory_is_the_host_class_and_the_size_is_derived() -> None:
    text = HEAD.format(what="latency") + (
        "Final:                 20000      0.277     0.289     0.289       26.42      26.42     3462361     3462361\n"
    )
    (t,) = parse_text(text)["tables"]
    assert t["device"] is None and t["rows"] == [[8, 0.289]] and t["perftest"]["size"] == 8


def test_a_header_without_its_final_row_is_cut() -> None:
    text = (
        HEAD.format(what="latency")
        + "[thread 0]              3214    154.754   155.608   155.608        0.05       0.05        6426        6426\n"
    )
    r = parse_text(text)
    assert r["kind"] == "ucx-perftest" and r["verdict"] == "failed"
    assert [f["code"] for f in r["findings"]] == ["truncated"]
