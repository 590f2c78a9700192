"""The runner's plain-Python parts: options and their precedence, benchmark selection, the
interleaved run order (intra- and inter-node), merging of log findings, and the comparison
of parsed runs (the real runs are in test_runner_local.py and test_runner_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dedal.cli import build_parser
from dedal.errors import UserError
from dedal.stages.verify import runner as R
from dedal.stages.verify.catalogue import CATALOGUE, KEYS, gpu_planned, select_benchmarks
from dedal.stages.verify.thresholds import Thresholds
from dedal.stages.verify.transports import HostFacts
from dedal.stages.verify.compare import (
    compare_runs,
    expectation_findings,
    log_findings,
    remeasurable,
    run_findings,
    skipped_checks,
    transports,
)
from dedal.stages.verify.plan import Plan, Run
from dedal.stages.verify.parsers import parse_file, parse_text

DATA = Path(__file__).parent / "data" / "runs"


def options(tmp_path: Path, *args: str) -> R.Options:
    image = tmp_path / "img.sif"
    image.write_bytes(b"x")
    ns = build_parser().parse_args(["verify", str(image), *args])
    return R.options_from_args(ns)


def test_options_defaults_and_precedence(tmp_path: Path, monkeypatch) -> None:
    for var in ("DEDAL_DATA_DIR", "DEDAL_REPORTS_DIR", "DEDAL_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    o = options(tmp_path)
    assert (o.ranks, o.repetitions, o.launcher, o.max_size, o.native) == (2, 5, "auto", 4 << 20, "auto")
    assert o.reports_dir == tmp_path / "data" / "dedal" / "reports"
    env_file = tmp_path / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["dedal-benchmarks"]},
                "dedal": {
                    "verify": {
                        "ranks": 4,
                        "repetitions": 7,
                        "launcher": "mpirun",
                        "benchmarks": ["latency", "bw"],
                        "env": {"UCX_TLS": "sm,self", "FOO": "1"},
                        "thresholds": {"latency_overhead_us": 0.3},
                    }
                },
            }
        )
    )
    o = options(
        tmp_path,
        "--env-file",
        str(env_file),
        "-e",
        "UCX_TLS=tcp",
        "-t",
        "bandwidth_pct=5",
        "--repetitions",
        "3",
        "--max-size",
        "64K",
    )
    assert (o.ranks, o.repetitions, o.launcher, o.benchmarks) == (4, 3, "mpirun", ["latency", "bw"])
    assert o.env == {"UCX_TLS": "tcp", "FOO": "1"}  # the command line wins
    assert o.thresholds == {"latency_overhead_us": 0.3, "bandwidth_pct": 5.0}
    assert o.max_size == 65536


@pytest.mark.parametrize(
    "args,message",
    [
        (("-e", "1X=2"), "--env"),
        (("-t", "bandwidth_pct=fast"), "expected a number"),
        (("-t", "nope=1"), "unknown verification threshold"),
        (("-b", "latency,,quux"), "unknown quux"),
        (("--ranks", "0"), "--ranks 0: at least 1"),
        (("--launcher", "mpirun", "--nodes", "3"), "srun launcher"),
    ],
)
def test_bad_options(tmp_path: Path, args, message) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        options(tmp_path, *args)


def test_missing_image(tmp_path: Path) -> None:
    ns = build_parser().parse_args(["verify", str(tmp_path / "nope.sif")])
    with pytest.raises(UserError, match="no such image"):
        R.options_from_args(ns)


def test_benchmark_selection() -> None:
    programs = {
        p: f"/opt/view/bin/{p}"
        for p in (
            "dedal_init",
            "dedal_latency",
            "dedal_bw",
            "dedal_allreduce",
            "dedal_nccl_allreduce",
            "osu_latency",
            "all_reduce_perf",
        )
    }
    chosen, notes = select_benchmarks(list(KEYS) + ["osu"], programs, gpu=False)
    assert [b.program for b in chosen] == ["dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce", "osu_latency"]
    assert not any("nccl" in n or "all_reduce" in n for n in notes)  # GPU checks left out are skipped checks
    # a GPU image plans the NCCL all-reduce, and OSU between device buffers where its OSU is built +cuda
    # (and every OSU run there: OSU built +cuda links libcuda, host buffers or not, and exits 127 without
    # the driver, as esd-gpu's did on a host without GPU)
    assert [b.name for b in gpu_planned(list(KEYS) + ["osu"], programs, osu_cuda=True)] == [
        "dedal_nccl_allreduce",
        "osu_latency",
        "all_reduce_perf",
        "osu_latency-cuda",
    ]  # no osu_bw in this image
    chosen, _ = select_benchmarks(list(KEYS) + ["osu"], programs, gpu=False, osu_cuda=True)
    assert [b.program for b in chosen] == ["dedal_init", "dedal_latency", "dedal_bw", "dedal_allreduce"]
    assert [b.name for b in gpu_planned(list(KEYS) + ["osu"], programs, osu_cuda=False)] == [
        "dedal_nccl_allreduce",
        "all_reduce_perf",
    ]
    chosen, notes = select_benchmarks(["latency", "osu"], programs, gpu=True, osu_cuda=False)
    assert [b.name for b in chosen] == ["dedal_latency", "osu_latency"]
    assert notes == [
        "dedal_cuda_floor: not in the image",
        "dedal_latency-cuda: the image's dedal-benchmarks predate device buffers (-d cuda)",
        "osu_latency-cuda: the image's OSU micro-benchmarks are not built with CUDA "
        "(osu-micro-benchmarks +cuda): no device-buffer runs",
    ]
    # the CUDA floor that device-buffer latency is held to (with latency on a GPU, within a node only),
    # and dedal's own latency between device buffers where its build knows -d cuda
    floor = {**programs, "dedal_cuda_floor": "/opt/view/bin/dedal_cuda_floor"}
    chosen, notes = select_benchmarks(["latency", "osu"], floor, gpu=True, osu_cuda=True, dedal_cuda=True)
    assert [b.name for b in chosen] == [
        "dedal_latency",
        "dedal_cuda_floor",
        "dedal_latency-cuda",
        "osu_latency",
        "osu_latency-cuda",
    ]
    assert chosen[1].intra_only and chosen[1].gpu and chosen[1].table == "dedal_cuda_floor"
    assert chosen[2].args(65536, 1) == ["-d", "cuda", "-m", "65536"] and chosen[2].table == "dedal_latency"
    assert [b.program for b in select_benchmarks(["latency"], floor, gpu=False)[0]] == ["dedal_latency"]
    # an image whose dedal_latency predates -d cuda: the runner's own build of it, named for the GPU runs
    own = {**floor, "dedal_latency-cuda": "/opt/dedal-verify/bin/dedal_latency"}
    chosen, notes = select_benchmarks(["latency"], own, gpu=True, dedal_cuda=False)
    assert [b.name for b in chosen] == ["dedal_latency", "dedal_cuda_floor", "dedal_latency-cuda"] and notes == []
    chosen, notes = select_benchmarks(["osu_latency-cuda"], programs, gpu=True, osu_cuda=True)
    assert [b.name for b in chosen] == ["osu_latency-cuda"] and notes == []
    dev = chosen[0]
    assert dev.program == "osu_latency" and dev.parser == "osu" and dev.table == "osu_latency"
    assert dev.args(4 << 20, 1) == ["-d", "cuda", "-m", str(4 << 20), "D", "D"]
    chosen, notes = select_benchmarks(["latency", "nccl"], programs, gpu=True)
    assert [b.program for b in chosen] == ["dedal_latency", "dedal_nccl_allreduce"]
    assert chosen[1].parser == "nccl-tests"
    chosen, notes = select_benchmarks(["init", "osu_bw"], {"dedal_init": "/x"}, gpu=False)
    assert [b.program for b in chosen] == ["dedal_init"] and notes == ["osu_bw: not in the image"]
    lat = next(b for b in CATALOGUE if b.program == "dedal_latency")
    assert lat.args(65536, 1 << 20) == ["-m", "65536"]
    ar = next(b for b in CATALOGUE if b.program == "dedal_allreduce")
    assert ar.args(4 << 20, 1 << 20) == ["-m", str(1 << 20)]
    nccl = next(b for b in CATALOGUE if b.program == "all_reduce_perf")
    assert nccl.args(1, 1 << 28) == ["-b", "8", "-e", str(1 << 28), "-f", "2", "-g", "1"]


def test_a_benchmark_of_one_node_runs_within_a_node_only() -> None:
    lat = next(b for b in CATALOGUE if b.program == "dedal_latency")
    floor = next(b for b in CATALOGUE if b.program == "dedal_cuda_floor")
    plan = Plan("srun", [("intra-node", 1), ("inter-node", 2)], [lat, floor], 1, 2, 1)
    assert [(s, b.program) for s, b in plan.pairs()] == [
        ("intra-node", "dedal_latency"),
        ("intra-node", "dedal_cuda_floor"),
        ("inter-node", "dedal_latency"),
    ]
    assert {(s, b.program) for s, b, _r, _side in plan.order()} == {
        ("intra-node", "dedal_latency"),
        ("intra-node", "dedal_cuda_floor"),
        ("inter-node", "dedal_latency"),
    }
    assert [c.name for c in skipped_checks([floor], plan.scopes, "no GPU")] == ["dedal_cuda_floor intra-node"]


def test_interleaved_order_intra_and_inter_node() -> None:
    init, lat = CATALOGUE[0], CATALOGUE[1]
    plan = Plan("srun", [("intra-node", 1), ("inter-node", 2)], [init, lat], 2, 4, 0)
    order = [(s, b.program, r, side) for s, b, r, side in plan.order()]
    assert order[:4] == [
        ("intra-node", "dedal_init", 0, "native"),
        ("intra-node", "dedal_init", 0, "container"),
        ("inter-node", "dedal_init", 0, "native"),
        ("inter-node", "dedal_init", 0, "container"),
    ]
    rep1 = [x for x in order if x[2] == 1]
    rep2 = [x for x in order if x[2] == 2]
    assert [x[3] for x in rep1] == ["native", "container"] * 4
    assert [x[3] for x in rep2] == ["container", "native"] * 4
    assert order.index(rep1[-1]) < order.index(rep2[0])  # a repetition covers every scope before the next
    assert plan.ranks_for(lat, 2) == 2 and plan.ranks_for(init, 1) == 4 and plan.ranks_for(init, 2) == 8


def _run(tmp_path: Path, side: str, rep: int, log: str, seconds: float = 1.0, bench=None) -> Run:
    bench = bench or CATALOGUE[1]
    parsed = parse_file(DATA / log)
    rel = f"raw/intra-node/{bench.program}/{side}-{rep:02d}.log"
    parsed.update(
        {
            "source": rel,
            "side": side,
            "scope": "intra-node",
            "program": bench.program,
            "repetition": rep,
            "returncode": 0,
        }
    )
    return Run(side, "intra-node", bench, rep, 2, 1, tmp_path / rel, rel, 0, seconds, False, parsed)


def test_compare_and_findings_from_real_logs(tmp_path: Path) -> None:
    good = "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log"
    tcp = "mpirun_container_dedal_latency_UCX_TLS_tcp_BAD.log"
    runs = [
        _run(tmp_path, "native", 1, good),
        _run(tmp_path, "container", 1, tcp),
        _run(tmp_path, "native", 2, good),
        _run(tmp_path, "container", 2, tcp),
    ]
    plan = Plan("mpirun", [("intra-node", 1)], [CATALOGUE[1]], 2, 2, 0)
    checks, measurements, summary = compare_runs(runs, plan, Thresholds())
    (chk,) = checks
    assert chk.name == "dedal_latency intra-node" and chk.verdict == "bad"
    assert measurements[chk.name]["native"][1] == [0.2, 0.2] and measurements[chk.name]["container"][1] == [183.11] * 2
    # the summary shows the size that decided the verdict (issue 23), here the worst excess: 64 KiB
    assert summary[0]["size"] == 65536 and summary[0]["state"] == "fail"
    assert summary[0]["native"] == 3.35 and summary[0]["container"] == 5246.88
    found = log_findings(runs, [], HostFacts())
    tcp_f = [f for f in found if f.code == "ucx-tcp-intra-node"]
    assert len(tcp_f) == 1 and tcp_f[0].message.startswith("[container] UCX uses TCP within a node")
    assert "seen in 2 of 2 container run log(s)" in tcp_f[0].message
    assert any("tag(tcp/lo tcp/eth0)" in e for e in tcp_f[0].evidence)
    assert tcp_f[0].evidence[-1] == "log: raw/intra-node/dedal_latency/container-01.log"
    assert not [f for f in found if f.message.startswith("[native]") and f.severity != "info"]
    assert transports(runs) == {
        "native": {"intra-node": ["cma/memory", "sysv/memory"]},
        "container": {"intra-node": ["tcp/eth0", "tcp/lo"]},
    }


H200 = Path(__file__).parent / "data" / "real" / "gpu"
FLOOR_LOG = (
    "$ prterun -np 2 dedal_cuda_floor -m 4194304\n# dedal-bench CUDA Floor Test v1.1\n"
    "# Size      IPC Latency(us)     D2H+sync(us)     D2D+sync(us)\n"
    + "".join(f"{1 << i:<10} {18.5:18.2f} {15.1:16.2f} {12.2:16.2f}\n" for i in range(23))
)


def _gpu_runs(tmp_path: Path, floor: bool):
    """Both sides ran the esd-gpu image's own binaries (the native side its unpacked root), so
    both measured what the H200 recordings show: 150 us between GPU buffers, 0.35 us between
    host buffers; and, where ``floor``, a CUDA IPC ping-pong of 18.5 us on that host."""
    benches = {b.name: b for b in CATALOGUE}
    runs = []
    for side in ("native", "container"):
        for rep in (1, 2):
            for name, text in (
                ("osu_latency-cuda", (H200 / "run2-C-osu-lat-DD.txt").read_text()),
                ("dedal_latency", (H200 / "dedal-latency.txt").read_text()),
                ("dedal_cuda_floor", FLOOR_LOG if floor else None),
            ):
                if text is None:
                    continue
                rel = f"raw/intra-node/{name}/{side}-{rep:02d}.log"
                runs.append(
                    Run(
                        side,
                        "intra-node",
                        benches[name],
                        rep,
                        2,
                        1,
                        tmp_path / rel,
                        rel,
                        0,
                        1.0,
                        False,
                        {**parse_text(text), "source": rel, "side": side, "returncode": 0},
                    )
                )
    plan = Plan(
        "mpirun",
        [("intra-node", 1)],
        [benches["dedal_latency"], benches["dedal_cuda_floor"], benches["osu_latency-cuda"]],
        2,
        2,
        1,
    )
    return runs, plan


def test_equally_slow_on_both_sides_is_reported_against_the_floor(tmp_path: Path) -> None:
    """Issue 36: native and container both 150 us between GPU buffers compare as "good"; the
    expectations judged over all the runs of each side say why it is bad."""
    runs, plan = _gpu_runs(tmp_path, floor=True)
    checks, _m, _s = compare_runs(runs, plan, Thresholds())
    assert {c.name: c.verdict for c in checks}["osu_latency-cuda intra-node"] == "good"  # native vs container
    found = expectation_findings(runs, plan)
    by = {(f.message.split("]")[0][1:], f.code): f for f in found}
    assert set(by) == {
        (side, code)
        for side in ("native", "container")
        for code in ("device-latency-vs-floor", "device-latency-vs-host")
    }
    floor = by[("container", "device-latency-vs-floor")]
    assert floor.implied_verdict == "bad" and "8.5x" in floor.message and "18.5 us" in floor.message
    assert floor.message.endswith("(intra-node)")
    assert "64 157.93" in floor.evidence and "log: raw/intra-node/osu_latency-cuda/container-01.log" in floor.evidence
    # the floor is the native side's, also for the container side
    assert "log: raw/intra-node/dedal_cuda_floor/native-01.log" in floor.evidence
    vs_host = by[("native", "device-latency-vs-host")]
    assert "464x the 0.34 us" in vs_host.message and vs_host.severity == "warning"
    # the per-log class bound gives way to the judgement over all runs, which knows the floor
    assert not [f for f in log_findings(runs, [], HostFacts(gpus=1)) if f.code.startswith("device-")]


def test_without_the_floor_the_class_bound_judges(tmp_path: Path) -> None:
    runs, plan = _gpu_runs(tmp_path, floor=False)
    codes = sorted({f.code for f in expectation_findings(runs, plan)})
    assert codes == ["device-latency-slow", "device-latency-vs-host"]


def test_another_round_of_repetitions_is_interleaved_as_the_first() -> None:
    init, lat = CATALOGUE[0], CATALOGUE[1]
    plan = Plan("srun", [("intra-node", 1), ("inter-node", 2)], [init, lat], 2, 4, 0)
    more = [(s, b.program, r, side) for s, b, r, side in plan.again([("inter-node", lat)], 3)]
    # repetitions 3 and 4 of the one pair, the odd one native first, as in order()
    assert more == [
        ("inter-node", "dedal_latency", 3, "native"),
        ("inter-node", "dedal_latency", 3, "container"),
        ("inter-node", "dedal_latency", 4, "container"),
        ("inter-node", "dedal_latency", 4, "native"),
    ]
    assert plan.order()[4:] == plan.again([(s, b) for s, _ in plan.scopes for b in plan.benches], 1)


def _slower(run: Run, factor: float) -> Run:
    """The run with every latency of its table ``factor`` times as long (its log as good as it was)."""
    assert run.parsed is not None
    table = dict(run.parsed["tables"][0])
    table["rows"] = [[size, round(value * factor, 3)] for size, value in table["rows"]]
    run.parsed = {**run.parsed, "tables": [table]}
    return run


def test_only_a_check_bad_on_timing_alone_is_remeasured(tmp_path: Path) -> None:
    good = "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log"
    plan = Plan("mpirun", [("intra-node", 1)], [CATALOGUE[1]], 3, 2, 0)

    def runs(factor: float, container_log: str = good) -> list:
        out = []
        for rep in (1, 2, 3):
            out.append(_run(tmp_path, "native", rep, good))
            out.append(_slower(_run(tmp_path, "container", rep, container_log), factor))
        return out

    # 50 % slower in every repetition, logs good: bad on timing alone
    slow = runs(1.5)
    checks = compare_runs(slow, plan, Thresholds())[0]
    assert checks[0].verdict == "bad" and {f.code for f in checks[0].findings if f.severity == "error"} == {
        "latency-overhead"
    }
    assert remeasurable(checks, slow, plan) == [("intra-node", CATALOGUE[1])]
    # as fast: nothing to measure again
    same = runs(1.0)
    assert compare_runs(same, plan, Thresholds())[0][0].verdict == "good"
    assert remeasurable(compare_runs(same, plan, Thresholds())[0], same, plan) == []
    # UCX over TCP in the container: the log says why, measured once is enough
    tcp = runs(1.0, "mpirun_container_dedal_latency_UCX_TLS_tcp_BAD.log")
    assert compare_runs(tcp, plan, Thresholds())[0][0].verdict == "bad"
    assert remeasurable(compare_runs(tcp, plan, Thresholds())[0], tcp, plan) == []
    # a run that failed: bad as it is
    failed = runs(1.5)
    failed[3].returncode = 1
    assert remeasurable(compare_runs(failed, plan, Thresholds())[0], failed, plan) == []


def test_remeasure_is_on_unless_turned_off(tmp_path: Path) -> None:
    on, off = options(tmp_path), options(tmp_path, "--no-remeasure")
    assert on.remeasure and not off.remeasure
    assert on.settings_digest() != off.settings_digest()
    on.remeasure = True
    assert on.settings_digest() == R.Options(**{**vars(off), "remeasure": True}).settings_digest()


def test_init_job_time_warns_but_never_fails(tmp_path: Path) -> None:
    init = CATALOGUE[0]
    log = "mpirun_container_dedal_init_GOOD.log"
    runs = [_run(tmp_path, "native", r, log, 0.8, init) for r in (1, 2, 3)]
    runs += [_run(tmp_path, "container", r, log, 3.0, init) for r in (1, 2, 3)]
    plan = Plan("mpirun", [("intra-node", 1)], [init], 3, 2, 0)
    checks, measurements, _ = compare_runs(runs, plan, Thresholds())
    names = [c.name for c in checks]
    assert names == ["dedal_init intra-node", "dedal_init intra-node job wall time"]
    job = checks[1]
    assert job.verdict == "suboptimal" and [f.code for f in job.findings] == ["startup-overhead"]
    assert job.findings[0].message.endswith("container's start included; MPI_Init: dedal_init intra-node)")
    assert measurements["dedal_init intra-node job wall time"]["container"][0] == [3000.0] * 3
    assert measurements["dedal_init intra-node"]["native"][0] == [393.581] * 3


def test_failed_and_same_host_runs(tmp_path: Path) -> None:
    log = tmp_path / "raw" / "x.log"
    log.parent.mkdir(parents=True)
    log.write_text("#@ note\n$ mpirun ...\nsome output\n[vm:1] *** An error occurred in MPI_Init\n")
    bench = CATALOGUE[1]
    bad = Run("container", "intra-node", bench, 1, 2, 1, log, "raw/x.log", 1, 0.5, False, parse_text("x"))
    skipped = Run("container", "intra-node", bench, 2, 2, 1, log, "raw/y.log", skipped="not repeated")
    inter = _run(tmp_path, "native", 1, "mpirun_native_dedal_latency_64K_ucx_sysv_cma_GOOD.log")
    inter.scope = "inter-node"
    found = {f.code: f for f in run_findings([bad, skipped, inter])}
    assert found["run-failed"].verdict == "failed" and "exited with code 1" in found["run-failed"].message
    assert "[vm:1] *** An error occurred in MPI_Init" in found["run-failed"].evidence
    assert found["runs-skipped"].severity == "warning"
    assert "one machine (vm)" in found["inter-node-same-host"].message


def test_image_names_of_the_workspace(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from dedal.stages.verify.image import resolve_image

    images = tmp_path / "images"
    (images / "esd-cpu").mkdir(parents=True)
    for tag in ("latest", "2025.1"):
        (images / "esd-cpu" / f"{tag}.sif").write_bytes(b"x")
    settings = SimpleNamespace(images_dir=images)
    assert resolve_image("esd-cpu", settings) == images / "esd-cpu" / "latest.sif"
    assert resolve_image("esd-cpu:2025.1", settings) == images / "esd-cpu" / "2025.1.sif"
    with pytest.raises(UserError, match="ENV\\[:TAG\\]"):
        resolve_image("esd-gpu", settings)


def _info(tmp_path: Path, kind: str = "sif"):
    from dedal.stages.verify.image import ImageInfo

    root = tmp_path / "imgroot"
    (root / "opt/view/bin").mkdir(parents=True, exist_ok=True)
    (root / "opt/view/bin/dedal_latency").write_bytes(b"\x7fELF the image's binary")
    import hashlib

    return ImageInfo(
        path=root if kind == "dir" else tmp_path / "x.sif",
        kind=kind,
        name="x",
        programs={"dedal_latency": "/opt/view/bin/dedal_latency", "mpirun": "/usr/bin/mpirun"},
        digests={"dedal_latency": hashlib.sha256(b"\x7fELF the image's binary").hexdigest()},
    )


def test_what_native_means(tmp_path: Path) -> None:
    from dedal.stages.verify.native import prepare_native

    info = _info(tmp_path)
    wanted = ["dedal_latency"]
    host = {"dedal_latency": "/spack/view/bin/dedal_latency"}
    mpirun = {"path": "/usr/bin/mpirun", "version_line": "mpirun (Open MPI) 5.0.5", "version": "5.0.5"}
    n = prepare_native(info, mode="auto", wanted=wanted, cache=tmp_path / "c", host_programs=host, host_mpi=mpirun)
    assert n.mode == "host" and n.root is None and "Open MPI) 5.0.5" in n.description
    assert n.programs == host
    with pytest.raises(UserError, match="--native host: the host lacks dedal_latency"):
        prepare_native(info, mode="host", wanted=wanted, cache=tmp_path / "c", host_programs={}, host_mpi=mpirun)
    with pytest.raises(UserError, match="lacks mpirun"):
        prepare_native(info, mode="host", wanted=wanted, cache=tmp_path / "c", host_programs=host, host_mpi=None)
    # srun needs no host mpirun
    assert (
        prepare_native(info, mode="auto", wanted=wanted, cache=tmp_path / "c", host_programs=host, launcher="srun").mode
        == "host"
    )
    # a directory image is plain files already
    d = _info(tmp_path, "dir")
    same = prepare_native(d, mode="rootfs", wanted=wanted, cache=tmp_path / "c", host_programs=host, host_mpi=mpirun)
    assert same.mode == "same-dir" and same.root == d.path and "differ only in the sandbox" in same.description
    # a given unpacked copy must hold the very same binaries
    copy = tmp_path / "copy"
    (copy / "opt/view/bin").mkdir(parents=True)
    (copy / "opt/view/bin/dedal_latency").write_bytes(b"\x7fELF another build")
    with pytest.raises(UserError, match="dedal_latency differ from the image's"):
        prepare_native(info, mode="auto", wanted=wanted, cache=tmp_path / "c", native_root=copy)
    (copy / "opt/view/bin/dedal_latency").write_bytes(b"\x7fELF the image's binary")
    ok = prepare_native(info, mode="auto", wanted=wanted, cache=tmp_path / "c", native_root=copy)
    assert ok.mode == "rootfs" and ok.root == copy and "byte-identical" in ok.description


@pytest.mark.parametrize("cuda", [True, False])
def test_osu_built_with_cuda_read_from_its_spec(tmp_path: Path, cuda: bool) -> None:
    """Device-buffer runs need osu-micro-benchmarks +cuda: read from the prefix's .spack/spec.json, here
    made of the real node of the mpi-cuda lock (the _meta of a real installed spec.json)."""
    import json

    from dedal.stages.verify.image import _osu_cuda
    from tests.conftest import SPACK_DATA

    lock = json.loads((SPACK_DATA / "mpi-cuda.spack.lock").read_text())
    node = next(n for n in lock["concrete_specs"].values() if n["name"] == "osu-micro-benchmarks")
    node = {**node, "parameters": {**node["parameters"], "cuda": cuda}}
    meta = json.loads((SPACK_DATA / "fixtures/dedal-app.prefix.spec.json").read_text())["spec"]["_meta"]
    root = tmp_path / "img"
    assert _osu_cuda(root, "/opt/esd/software") is None  # no install root: unknown
    prefix = root / f"opt/esd/software/linux-x86_64_v3/osu-micro-benchmarks-{node['version']}-{node['hash']}"
    (prefix / ".spack").mkdir(parents=True)
    (prefix / ".spack/spec.json").write_text(json.dumps({"spec": {"_meta": meta, "nodes": [node]}}))
    assert _osu_cuda(root, "/opt/esd/software") is cuda


def test_the_rank_scripts_machine_line_is_what_the_parser_reads(tmp_path: Path) -> None:
    """dedal's rank script (run by srun for every rank) says which machine the rank is on."""
    import subprocess

    from dedal.adapters.mpi import write_rank_script
    from dedal.stages.verify.parsers._text import rank_machines

    script = write_rank_script(tmp_path)
    p = subprocess.run(["/bin/sh", str(script), "true"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    [me] = rank_machines(p.stderr)
    boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    cpus = sum(1 for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("processor"))
    assert me == {
        "host": subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip(),
        "boot_id": boot_id,
        "cpus": cpus,
    }


def _srun_run(tmp_path: Path, scope: str, ranks_at: list) -> Run:
    """An srun step's log as the rank script and UCX write it: ranks at (host, boot id)."""
    lines = [f"#@ dedal-rank: host={h} boot_id={b} cpus=2" for h, b in ranks_at]
    lines += ["# dedal-bench MPI Allreduce Latency Test v1.0", "# Size       Avg Latency(us)", "4   35000.1"]
    log = tmp_path / "raw" / scope / "allreduce.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(lines) + "\n")
    bench = CATALOGUE[3]
    rel = str(log.relative_to(tmp_path))
    return Run("container", scope, bench, 1, len(ranks_at), 2, log, rel, 0, 1.0, False, parse_file(log))


def test_nodes_that_are_one_machine_and_more_ranks_than_cpus(tmp_path: Path) -> None:
    """The namespaced test cluster's nodes are network namespaces of one host: the kernel's boot
    id says so where the node names do not; 2 ranks on each of 2 such nodes are 4 busy-polling
    ranks on 2 CPUs."""
    a, b = "0f4a7c3e-1111-4e5e-9a0b-aaaaaaaaaaaa", "9b2d5e61-2222-4c1a-8f3d-bbbbbbbbbbbb"
    shared = _srun_run(tmp_path, "inter-node", [("node1", a), ("node1", a), ("node2", a), ("node2", a)])
    assert shared.parsed["rank_machines"][2] == {"host": "node2", "boot_id": a, "cpus": 2}
    assert shared.parsed["tables"]  # the rank lines do not disturb the benchmark's own parser
    found = {f.code: f for f in run_findings([shared])}
    assert "nodes node1, node2 that are one machine (one kernel, boot id " + a in found["nodes-share-machine"].message
    assert "4 ranks on 2 CPUs, nodes node1, node2" in found["oversubscribed"].message
    assert found["oversubscribed"].evidence == ["log: raw/inter-node/allreduce.log"]
    assert "inter-node-same-host" not in found  # the names differ: only the boot id tells

    apart = _srun_run(tmp_path, "inter-node", [("node1", a), ("node1", a), ("node2", b), ("node2", b)])
    assert not {"nodes-share-machine", "oversubscribed"} & {f.code for f in run_findings([apart])}
    crowded = _srun_run(tmp_path, "intra-node", [("node1", a)] * 3)
    assert [f.code for f in run_findings([crowded])] == ["oversubscribed"]


def test_launcher_stub_is_told_from_a_launcher(tmp_path: Path) -> None:
    """What Spack's openmpi recipe installs as mpirun/mpiexec with schedulers=slurm
    ~legacylaunchers (its nolegacylaunchers.sh, copied from Spack e8f8cf85's
    var/spack/repos/builtin/packages/openmpi/) against a launcher, a launcher whose comment
    names the stub (the GPU kit's, taken for the stub before), and a program."""
    from dedal.stages.verify.image import is_launcher_stub

    assert is_launcher_stub(Path(__file__).parent / "data" / "launchers" / "spack-openmpi-nolegacylaunchers.sh")
    script = tmp_path / "mpirun"
    script.write_text('#!/bin/sh\nexec prterun "$@"\n')
    assert not is_launcher_stub(script)
    kit = tmp_path / "kit-mpirun"
    kit.write_text(
        "#!/bin/sh\n# dedal GPU kit: Open MPI 5's own launcher in place of Spack's srun stub "
        '(~legacylaunchers)\nexec /opt/view/bin/prterun --personality ompi "$@"\n'
    )
    assert not is_launcher_stub(kit)
    assert not is_launcher_stub(Path("/bin/sh"))  # a program
    assert not is_launcher_stub(tmp_path / "missing")


@pytest.mark.spack
def test_spacks_own_launcher_stub_is_recognised(real_spack: Path) -> None:
    from dedal.stages.verify.image import is_launcher_stub

    assert is_launcher_stub(real_spack / "var/spack/repos/builtin/packages/openmpi/nolegacylaunchers.sh")
