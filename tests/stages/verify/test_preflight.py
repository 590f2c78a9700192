"""Preflight checks on files shaped like the host's (/proc/cpuinfo, /proc/driver/nvidia/version,
/dev/infiniband) and on recorded `srun --mpi=list` outputs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dedal.stages.verify import preflight as pre
from dedal.stages.verify.parsers import parse_file, parse_text
from tests.conftest import LOGS_DATA

# /proc/cpuinfo of an AVX2 machine without AVX-512 (Haswell-class), and of an old one
HASWELL_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
    "sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology cpuid pni "
    "pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand "
    "hypervisor lahf_lm abm cpuid_fault invpcid_single pti fsgsbase bmi1 avx2 smep bmi2 erms "
    "invpcid xsaveopt arat"
)
NEHALEM_FLAGS = (
    "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse "
    "sse2 ht syscall nx lm constant_tsc pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm"
)
# the first line of /proc/driver/nvidia/version, proprietary and open kernel modules
NVRM_535 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
NVRM_OPEN_560 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Fri Aug 16 21:22:33 UTC 2024\n"
)


def cpuinfo(tmp_path: Path, flags: str, model: str = "Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz") -> Path:
    p = tmp_path / "cpuinfo"
    p.write_text(
        "".join(
            f"processor\t: {i}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\nflags\t\t: {flags}\n\n"
            for i in range(2)
        )
    )
    return p


def test_cpu_target_levels(tmp_path: Path) -> None:
    flags = pre.cpu_info(cpuinfo(tmp_path, HASWELL_FLAGS))["flags"]
    assert [f.code for f in pre.check_cpu_target("x86_64_v3", flags, "x86_64")] == ["cpu-target"]
    assert pre.check_cpu_target("haswell", flags, "x86_64")[0].severity == "info"
    (v4,) = pre.check_cpu_target("x86_64_v4", flags, "x86_64")
    assert v4.severity == "error" and v4.code == "cpu-target" and "avx512f" in v4.message
    assert "Illegal instruction" in v4.message
    old = pre.cpu_info(cpuinfo(tmp_path, NEHALEM_FLAGS))["flags"]
    (v3,) = pre.check_cpu_target("x86_64_v3", old, "x86_64")
    assert v3.severity == "error" and "avx2" in v3.message and "bmi2" in v3.message and "fma" in v3.message
    assert pre.check_cpu_target("x86_64_v2", old, "x86_64")[0].severity == "info"


def test_cpu_target_other_architectures_and_unknowns() -> None:
    (mis,) = pre.check_cpu_target("neoverse_v2", {"avx2"}, "x86_64")
    assert mis.code == "cpu-arch-mismatch" and mis.severity == "error"
    assert pre.check_cpu_target("neoverse_v2", set(), "aarch64")[0].severity == "info"
    assert pre.check_cpu_target("x86_64_v9", {"avx2"}, "x86_64")[0].code == "cpu-target-unchecked"
    assert pre.check_cpu_target(None, set(), "x86_64")[0].code == "cpu-target-unknown"


def test_this_hosts_cpu_reads() -> None:
    info = pre.cpu_info()
    assert info["readable"] and info["flags"]


def test_gpu_driver_versions(tmp_path: Path) -> None:
    v = tmp_path / "version"
    gpus = tmp_path / "gpus"
    (gpus / "0000:3b:00.0").mkdir(parents=True)
    (gpus / "0000:5e:00.0").mkdir()
    v.write_text(NVRM_535)
    d = pre.gpu_driver(v, gpus)
    assert d["driver"] == "535.104.05" and d["gpus"] == 2
    v.write_text(NVRM_OPEN_560)
    assert pre.gpu_driver(v, gpus)["driver"] == "560.35.03"
    assert pre.gpu_driver(tmp_path / "absent", gpus) == {"driver": None, "gpus": 0, "line": ""}


@pytest.mark.parametrize(
    "cuda,driver,want,code,severity",
    [
        ("12.2.2", "535.104.05", True, "gpu-driver", "info"),
        ("12.6.2", "535.104.05", True, "gpu-driver-minor-compat", "warning"),  # minor version compatibility
        ("12.4.1", "470.199.02", True, "gpu-driver-too-old", "error"),  # CUDA 12 needs >= 525.60.13
        ("12.4.1", "470.199.02", False, "gpu-driver-too-old", "warning"),  # not fatal without GPU runs
        ("13.0.1", "560.35.03", True, "gpu-driver-too-old", "error"),
        ("11.8.0", "535.104.05", True, "gpu-driver", "info"),
        ("12.7.0", "565.57.01", True, "gpu-driver", "info"),  # unlisted minor: 12.6's minimum
        ("12.4.1", None, True, "gpu-driver-missing", "error"),
        ("12.4.1", None, False, "gpu-driver-missing", "info"),
    ],
)
def test_gpu_driver_vs_cuda(cuda, driver, want, code, severity) -> None:
    (f,) = pre.check_gpu(cuda, driver, 4, want_gpu=want)
    assert (f.code, f.severity) == (code, severity), f.message
    if code == "gpu-driver-too-old":
        assert "CUDA driver version is insufficient" in f.message


def test_no_cuda_in_image() -> None:
    assert pre.check_gpu(None, "535.104.05", 4, want_gpu=False) == []
    (f,) = pre.check_gpu(None, "535.104.05", 4, want_gpu=True)
    assert f.code == "gpu-no-cuda" and f.severity == "error"


def test_infiniband(tmp_path: Path) -> None:
    ib = tmp_path / "infiniband"
    assert pre.infiniband(ib) == []
    ib.mkdir()
    for name in ("uverbs0", "rdma_cm", "umad0"):
        (ib / name).write_text("")
    assert pre.infiniband(ib) == ["rdma_cm", "umad0", "uverbs0"]
    assert pre.check_infiniband(["uverbs0"], multi_node=True)[0].code == "infiniband"
    (none,) = pre.check_infiniband([], multi_node=True)
    assert none.code == "no-infiniband" and "not a fallback" in none.message


def test_pmix_from_recorded_srun_mpi_list() -> None:
    v5 = parse_file(LOGS_DATA / "slurm_pmix" / "srun_mpi_list_slurm_pmix_v5_oci.txt", "srun-mpi-list")
    assert [f.code for f in pre.check_pmix(v5)] == ["pmix"]
    # Debian bookworm's Slurm 22.05 (the host of this project's test cluster)
    v4 = parse_text(
        "MPI plugin types are...\n\tpmix\n\tnone\n\tcray_shasta\n\tpmi2\n"
        "specific pmix plugin versions available: pmix_v4\n",
        "srun-mpi-list",
    )
    codes = [f.code for f in pre.check_pmix(v4)]
    assert codes == ["pmix", "pmix-server-old"]
    none = parse_text("MPI plugin types are...\n\tnone\n\tpmi2\n", "srun-mpi-list")
    (f,) = pre.check_pmix(none)
    assert f.code == "pmix-missing" and f.severity == "error" and "pmi2" in f.evidence[0]


def test_run_preflight_fatal_and_facts(tmp_path: Path) -> None:
    cpu = cpuinfo(tmp_path, NEHALEM_FLAGS)
    nv = tmp_path / "version"
    nv.write_text(NVRM_535)
    gpus = tmp_path / "gpus"
    (gpus / "0000:3b:00.0").mkdir(parents=True)
    listing = "MPI plugin types are...\n\tnone\n\tpmi2\n"
    pf = pre.run_preflight(
        image_target="x86_64_v3",
        image_cuda="12.6.2",
        image_arch="amd64",
        launcher="srun",
        nodes=2,
        want_gpu=None,
        srun_mpi_list=lambda: listing,
        allocation_nodes=1,
        cpuinfo=cpu,
        nvidia_version=nv,
        nvidia_gpus=gpus,
        infiniband_dir=tmp_path / "no-ib",
        machine="x86_64",
    )
    assert {f.code for f in pf.fatal} == {"cpu-target", "pmix-missing", "nodes"}
    assert pf.host.multi_node and not pf.host.has_infiniband and pf.host.gpus == 1
    assert pf.facts["nvidia_driver"] == "535.104.05" and pf.facts["gpu_benchmarks"] is True
    line = pf.fatal_line()
    assert line.startswith("preflight: ") and "avx2" in line and "pmix" in line
    ok = pre.run_preflight(
        image_target="x86_64_v2",
        image_cuda=None,
        image_arch="amd64",
        launcher="mpirun",
        nodes=1,
        want_gpu=None,
        cpuinfo=cpu,
        nvidia_version=tmp_path / "none",
        nvidia_gpus=tmp_path / "none",
        infiniband_dir=tmp_path / "no-ib",
        machine="x86_64",
    )
    assert not ok.fatal and ok.host.gpus == 0 and not ok.host.multi_node


def _stat(tmp_path: Path, busy: int, idle: int, iowait: int = 0):
    """A /proc/stat whose ticks move by ``busy`` working and ``idle`` + ``iowait`` idle ticks
    while check_load waits (its ``sleep``), as a host's do."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  1000 0 500 8000 100 0 0 0 0 0\ncpu0 500 0 250 4000 50 0 0 0 0 0\n")

    def sleep(_seconds: float) -> None:
        stat.write_text(f"cpu  {1000 + busy} 0 500 {8000 + idle} {100 + iowait} 0 0 0 0 0\n")

    return stat, sleep


def test_busy_host_is_reported_with_the_numbers(tmp_path):
    from dedal.stages.verify.load import check_load

    load = tmp_path / "loadavg"
    load.write_text("3.50 2.00 1.00 3/200 1234\n")
    stat, sleep = _stat(tmp_path, busy=40, idle=10)
    [f] = check_load(load, cpus=2, stat=stat, sleep=sleep, allowed=())
    assert f.severity == "warning" and f.code == "host-busy" and "noise" in f.message
    assert "80% of 2 CPU(s) in use, load average 3.50" in f.message
    stat, sleep = _stat(tmp_path, busy=5, idle=40, iowait=5)
    [g] = check_load(load, cpus=2, stat=stat, sleep=sleep, allowed=())
    assert g.severity == "info" and g.code == "host-load" and "10% of 2 CPU(s) in use" in g.message


def test_a_load_average_of_work_that_has_just_ended_is_not_a_busy_host(tmp_path):
    """The first build-image measured here: the build and the assembly before the verification
    left the 1-minute load average at 1.47 on 2 CPUs, with one process running (dedal's own):
    the report said host-busy, and the next build-image verified again. What is in use now decides."""
    from dedal.stages.verify.load import check_load

    load = tmp_path / "loadavg"
    load.write_text("1.47 0.90 1.18 1/84 31704\n")
    stat, sleep = _stat(tmp_path, busy=1, idle=49)
    [f] = check_load(load, cpus=2, stat=stat, sleep=sleep, allowed=())
    assert f.code == "host-load" and "2% of 2 CPU(s) in use, load average 1.47" in f.message


def test_in_a_cpuset_only_its_cpus_count(tmp_path):
    """A Slurm step on a node shared with other jobs: CPUs 2 and 3 are busy with theirs, the
    step's 0 and 1 idle. The step's CPUs decide, not the node's (which would say host-busy)."""
    from dedal.stages.verify.load import check_load

    load = tmp_path / "loadavg"
    load.write_text("2.00 2.00 2.00 3/200 1234\n")
    stat = tmp_path / "stat"

    def write(t: int) -> None:
        busy, idle = f"{100 + 50 * t} 0 0 {100} 0 0 0 0", f"100 0 0 {100 + 50 * t} 0 0 0 0"
        lines = [f"cpu  {200 + 100 * t} 0 0 {200 + 100 * t} 0 0 0 0", f"cpu0 {idle}", f"cpu1 {idle}"]
        stat.write_text("\n".join(lines + [f"cpu2 {busy}", f"cpu3 {busy}", "intr 1 2"]) + "\n")

    write(0)
    [f] = check_load(load, cpus=4, stat=stat, sleep=lambda _s: write(1), allowed={0, 1})
    assert f.code == "host-load" and "0% of the 2 CPU(s) this job may use of 4 in use" in f.message
    write(0)
    [g] = check_load(load, cpus=4, stat=stat, sleep=lambda _s: write(1), allowed={2, 3})
    assert g.code == "host-busy" and "100% of the 2 CPU(s)" in g.message
    write(0)
    [h] = check_load(load, cpus=4, stat=stat, sleep=lambda _s: write(1), allowed=())  # the whole node: half busy
    assert h.code == "host-load" and "50% of 4 CPU(s) in use" in h.message


def test_without_proc_stat_the_load_average_decides(tmp_path):
    from dedal.stages.verify.load import check_load

    busy = tmp_path / "loadavg"
    busy.write_text("3.50 2.00 1.00 3/200 1234\n")
    [f] = check_load(busy, cpus=2, stat=tmp_path / "no-stat")
    assert f.code == "host-busy" and "load average 3.50 on 2 CPU(s)" in f.message
    idle = tmp_path / "idle"
    idle.write_text("0.10 0.20 0.30 1/200 1234\n")
    [g] = check_load(idle, cpus=2, stat=tmp_path / "no-stat")
    assert g.severity == "info" and g.code == "host-load"
    assert check_load(tmp_path / "missing", cpus=2, stat=tmp_path / "no-stat") == []
    (tmp_path / "bad-stat").write_text("intr 12 34\n")  # not the cpu line: unreadable as such
    assert check_load(tmp_path / "missing", cpus=2, stat=tmp_path / "bad-stat") == []


def test_host_busy_is_the_rule_of_the_host_busy_finding(tmp_path):
    """build-image asks whether this host is busy now (to measure a busy host's report again)
    by the rule the verification itself applies."""
    from dedal.stages.verify.load import host_busy

    load = tmp_path / "loadavg"
    load.write_text("1.01 0.50 0.20 2/200 1234\n")
    no_stat = tmp_path / "no-stat"
    assert host_busy(load, cpus=2, stat=no_stat) and not host_busy(load, cpus=4, stat=no_stat)
    assert not host_busy(tmp_path / "missing", cpus=2, stat=no_stat)  # unreadable: not known to be busy


def test_the_cpus_in_use_are_read_from_this_host():
    from dedal.stages.verify.load import cpu_in_use

    share = cpu_in_use(window=0.05)
    assert share is not None and 0.0 <= share <= 1.0
    mine = cpu_in_use(window=0.05, allowed=os.sched_getaffinity(0))  # the per-CPU lines
    assert mine is not None and 0.0 <= mine <= 1.0


def test_cuda_12_4_image_against_the_host_driver(tmp_path: Path) -> None:
    """The image of issue 19 carries CUDA 12.4 (Debian trixie's toolkit 12.4.131), whose own driver is
    550.54.14: a newer driver passes, a 12.x driver below it runs through minor version compatibility
    (a warning naming both versions), a driver older than CUDA 12's floor stops the verification."""
    cpu = cpuinfo(tmp_path, HASWELL_FLAGS)
    gpus = tmp_path / "gpus"
    (gpus / "0000:3b:00.0").mkdir(parents=True)
    nv = tmp_path / "version"
    load = tmp_path / "loadavg"
    load.write_text("0.00 0.00 0.00 1/100 1\n")

    def preflight(driver: str) -> pre.Preflight:
        nv.write_text(NVRM_535.replace("535.104.05", driver))
        return pre.run_preflight(
            image_target="x86_64_v3",
            image_cuda="12.4.131",
            image_arch=None,
            launcher="mpirun",
            nodes=1,
            want_gpu=None,
            cpuinfo=cpu,
            nvidia_version=nv,
            nvidia_gpus=gpus,
            infiniband_dir=tmp_path / "no-ib",
            loadavg=load,
            machine="x86_64",
        )

    def gpu_findings(pf: pre.Preflight):
        return [(f.severity, f.code) for f in pf.findings if f.code.startswith("gpu")]

    new = preflight("550.54.15")
    assert gpu_findings(new) == [("info", "gpu-driver")] and not new.fatal
    assert new.facts["gpu_benchmarks"] is True and new.host.gpus == 1
    compat = preflight("535.104.05")
    assert gpu_findings(compat) == [("warning", "gpu-driver-minor-compat")] and not compat.fatal
    (f,) = [f for f in compat.findings if f.code == "gpu-driver-minor-compat"]
    assert "535.104.05" in f.message and "12.4.131" in f.message and "550.54.14" in f.message
    old = preflight("470.199.02")
    assert [f.code for f in old.fatal] == ["gpu-driver-too-old"]
    line = old.fatal_line()
    assert "470.199.02" in line and "525.60.13" in line and "CUDA driver version is insufficient" in line
    # without a driver (no GPU) nothing is fatal: the GPU checks are skipped
    nv.unlink()
    none = pre.run_preflight(
        image_target="x86_64_v3",
        image_cuda="12.4.131",
        image_arch=None,
        launcher="mpirun",
        nodes=1,
        want_gpu=None,
        cpuinfo=cpu,
        nvidia_version=nv,
        nvidia_gpus=tmp_path / "none",
        infiniband_dir=tmp_path / "no-ib",
        loadavg=load,
        machine="x86_64",
    )
    assert not none.fatal and none.facts["gpu_benchmarks"] is False
    assert gpu_findings(none) == [("info", "gpu-driver-missing")]


def test_gpu_passthrough_of_the_runtime() -> None:
    assert pre.check_passthrough("bwrap", [], "", use_gpu=False) == []
    (ok,) = pre.check_passthrough("apptainer", [], "", use_gpu=True)
    assert ok.code == "gpu-passthrough" and "--nv" in ok.message
    (ok,) = pre.check_passthrough("bwrap", ["libcuda.so.1", "libcuda.so", "libnvidia-ml.so.1"], "", use_gpu=True)
    assert ok.severity == "info" and "3 libraries" in ok.message
    (bad,) = pre.check_passthrough("charliecloud", ["libGL.so.1"], "no NVIDIA driver on this host", use_gpu=True)
    assert bad.severity == "error" and bad.code in pre.FATAL and "no NVIDIA driver on this host" in bad.message
    assert bad.evidence == ["driver libraries found: libGL.so.1"]


def test_gpu_versions_only_for_a_run_on_the_gpu() -> None:
    facts = {"gpu_benchmarks": True, "nvidia_driver": "570.124.06", "image_cuda": "12.4.131"}
    assert pre.gpu_versions(facts) == "host NVIDIA driver 570.124.06, image CUDA 12.4.131"
    assert pre.gpu_versions({**facts, "gpu_benchmarks": False}) == ""
    assert pre.gpu_versions({"gpu_benchmarks": True}) == "host NVIDIA driver unknown, image CUDA unknown"


def test_a_user_who_can_mount_nothing_is_told_before_the_runs():
    """Measured as such a user: every container run of the demo took 18.8 s (Apptainer
    unpacked the SIF each time), against 0.27 s natively; said first, with its cause."""
    [f] = pre.check_mount("apptainer", "sif", cannot_mount=True)
    assert f.severity == "warning" and f.code == "no-mount" and "/dev/fuse" in f.message
    assert pre.check_mount("apptainer", "sif", cannot_mount=False) == []
    assert pre.check_mount("bwrap", "sif", cannot_mount=True) == []  # not Apptainer's start
    assert pre.check_mount("apptainer", "dir", cannot_mount=True) == []  # a directory is not unpacked
