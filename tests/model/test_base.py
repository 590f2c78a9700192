"""Base definitions, ids and mirror resolution (no build)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dedal.model import base
from dedal.stages.base import check_can_build, ensure_base, resolve_mirror
from dedal.model import config
from dedal.adapters import debootstrap
from dedal.errors import UserError
from dedal.model.envfile import load_env
from tests.conftest import ROOT, dedal_exe


def test_known_definitions():
    names = base.known_names()
    for name in ("debian-trixie", "rocky9-build", "rocky9-runtime", "rocky9-cuda"):
        assert name in names
    d = base.load_definition("debian-trixie")
    assert (d.kind, d.suite, d.variant, d.arch) == ("debian", "trixie", "minbase", "amd64")
    pkgs = d.all_packages
    for p in (
        "gcc",
        "g++",
        "gfortran",
        "make",
        "python3",
        "patch",
        "bzip2",
        "xz-utils",
        "unzip",
        "file",
        "ca-certificates",
        "git",
        "openmpi-bin",
        "libopenmpi-dev",
        "libpmix-dev",
        "ucx-utils",
    ):
        assert p in pkgs
    assert d.record_versions["openmpi"] == "openmpi-bin"
    assert "prrte" in d.probe_versions


def test_apptainer_definitions_parse():
    for name in ("rocky9-build", "rocky9-runtime", "rocky9-cuda"):
        d = base.load_definition(name)
        assert d.kind == "apptainer" and d.variant == "docker" and d.suite.startswith("rockylinux")
        assert "%post" in d.text and d.description
    assert "cuda" in base.load_definition("rocky9-cuda").text.lower()


def test_unknown_name_lists_known():
    with pytest.raises(UserError) as exc:
        base.load_definition("ubuntu-nope")
    assert "unknown base image 'ubuntu-nope'" in str(exc.value) and "debian-trixie" in str(exc.value)


def test_definition_id_is_content_address(tmp_path, monkeypatch):
    d = base.load_definition("debian-trixie")
    assert base.definition_id(d) == base.definition_id(base.load_definition("debian-trixie"))
    assert base.definition_id(d).startswith("debian-trixie-")
    changed = tmp_path / "debian-trixie.yaml"
    changed.write_text(d.text.replace("    - less\n", "    - less\n    - vim-tiny\n"))
    assert base.definition_id(base.load_definition(str(changed))) != base.definition_id(d)
    monkeypatch.setattr(base, "RECIPE_VERSION", "999")
    assert base.definition_id(d) != base.definition_id(base.load_definition(str(changed)))


@pytest.mark.parametrize(
    "text, message",
    [
        ("suite: [1, 2]\n", "suite: expected str"),
        ("name: x\n", "suite: required"),
        ("suite: trixie\npackages: {build: [1]}\n", "packages.build: expected a list"),
        ("suite: trixie\nfrobnicate: 1\n", "unknown key(s) frobnicate"),
        ("suite: trixie\nos: fedora\n", "only debian"),
        ("suite: [unclosed\n", "not valid YAML"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_bad_yaml_definitions(tmp_path, text, message):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        base.load_definition(str(p))


def test_bad_def_file(tmp_path):
    p = tmp_path / "x.def"
    p.write_text("%post\n  echo hi\n")
    with pytest.raises(UserError, match="no 'Bootstrap:' header"):
        base.load_definition(str(p))


def test_host_sources_both_formats(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text(
        "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n"
        "deb http://mirror.example/debian-security bookworm-security main\n"
    )
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://other.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n"
        "Types: deb\nURIs: http://other.example/debian-security\nSuites: bookworm-security\n"
    )
    (apt / "sources.list.d" / "x.sources.disabled").write_text("Types: deb\nURIs: http://no/debian\nSuites: x\n")
    entries = debootstrap.host_sources(apt)
    assert [e["uris"][0] for e in entries] == [
        "http://mirror.example/debian",
        "http://mirror.example/debian-security",
        "http://other.example/debian",
        "http://other.example/debian-security",
    ]
    assert debootstrap.host_mirrors(apt) == {
        "archive": "http://mirror.example/debian",
        "security": "http://mirror.example/debian-security",
    }
    assert debootstrap.host_mirrors(tmp_path / "none") == {}


def test_mirror_precedence(monkeypatch):
    d = base.load_definition("debian-trixie")
    monkeypatch.setattr(debootstrap, "host_mirrors", lambda etc=None: {"archive": "http://host/debian"})
    s = config.load_settings(environ={})
    assert resolve_mirror(d, s)["archive"] == "http://host/debian"
    s = config.load_settings(overrides={"debian_mirror": "http://setting/debian/"}, environ={})
    assert resolve_mirror(d, s)["archive"] == "http://setting/debian"
    d.mirror = "http://defn/debian"
    assert resolve_mirror(d, s)["archive"] == "http://defn/debian"
    monkeypatch.setattr(debootstrap, "host_mirrors", lambda etc=None: {})
    d.mirror = ""
    assert resolve_mirror(d, config.load_settings(environ={}))["archive"] == "http://deb.debian.org/debian"


def test_installed_packages_parser(tmp_path):
    status = tmp_path / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_text(
        "Package: a\nStatus: install ok installed\nVersion: 1.0\nDescription: x\n y\n\n"
        "Package: b\nStatus: deinstall ok config-files\nVersion: 2\n\n"
        "Package: c\nStatus: install ok installed\nArchitecture: amd64\nVersion: 3:1.2-1\n"
    )
    assert debootstrap.installed_packages(tmp_path) == {"a": "1.0", "c": "3:1.2-1"}
    with pytest.raises(UserError, match="no dpkg database"):
        debootstrap.installed_packages(tmp_path / "nothing")


def test_list_and_show_without_build(tmp_path):
    s = config.load_settings(overrides={"base_cache": str(tmp_path / "cache")}, environ={})
    rows = {r["name"]: r for r in base.list_bases(s)}
    assert rows["debian-trixie"]["built"] is False and rows["debian-trixie"]["buildable_here"]
    assert rows["rocky9-cuda"]["kind"] == "apptainer"
    shown = base.show_base("debian-trixie", s)
    assert shown["built"] is False and shown["definition"]["suite"] == "trixie"


def test_failed_build_leaves_nothing(tmp_path, monkeypatch):
    """An unreachable mirror fails debootstrap: ToolError with the log, no base, no temp dir."""
    if __import__("os").geteuid() != 0:
        pytest.skip("debootstrap needs root")
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "broken.yaml").write_text("suite: trixie\nmirror: http://127.0.0.1:9/debian\npackages: [gcc]\n")
    monkeypatch.setenv("DEDAL_BASE_IMAGES_DIR", str(defs))
    cache = tmp_path / "cache"
    s = config.load_settings(overrides={"base_cache": str(cache)}, environ={})
    from dedal.errors import ToolError

    with pytest.raises(ToolError) as exc:
        ensure_base("broken", s)
    assert exc.value.log_path and exc.value.log_path.is_file()
    assert "debootstrap" in str(exc.value)
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".") or p.is_dir()) == ["logs"]
    assert base.find_base("broken", s) is None


def test_apt_releases_and_input_labels(tmp_path):
    """What a base records of its live mirror (read before clean_root drops apt's lists), and
    the image labels made of it: a rebuild tells "inputs changed" from "not reproducible". The
    Release files' dates stay in base.json, out of the labels: the archive re-signs them without
    new packages, and the same packages built on another day must give the same image."""
    lists = tmp_path / "var/lib/apt/lists"
    lists.mkdir(parents=True)
    (lists / "deb.debian.org_debian_dists_trixie_InRelease").write_text(
        "-----BEGIN PGP SIGNED MESSAGE-----\nOrigin: Debian\nDate: Sat, 08 Nov 2025 09:39:58 UTC\nSuite: stable\n"
    )
    (lists / "deb.debian.org_debian_dists_trixie_main_binary-amd64_Packages").write_text("Package: a\n")
    (lists / "lock").write_text("")
    found = debootstrap.apt_releases(tmp_path)
    assert list(found) == ["deb.debian.org_debian_dists_trixie_InRelease"]
    assert found["deb.debian.org_debian_dists_trixie_InRelease"]["date"] == "Sat, 08 Nov 2025 09:39:58 UTC"
    assert len(found["deb.debian.org_debian_dists_trixie_InRelease"]["sha256"]) == 64
    assert debootstrap.apt_releases(tmp_path / "nothing") == {}

    img = base.BaseImage(
        name="b",
        id="b-1",
        path=tmp_path,
        kind="debian",
        os_release={},
        versions={},
        packages={"zlib1g": "1:1.3", "bash": "5.2"},
        mirror="http://m/debian",
        apt_releases=found,
    )
    labels = base.input_labels(img)
    assert labels["dedal.base.packages.count"] == "2" and labels["dedal.base.mirror"] == "http://m/debian"
    assert not any("apt_releases" in k for k in labels) and "Sat, 08 Nov 2025" not in "".join(labels.values())
    assert base.BaseImage.from_json(img.to_json()).apt_releases == found  # base.json keeps them
    resigned = {k: {**v, "date": "Mon, 10 Nov 2025 02:00:00 UTC"} for k, v in found.items()}
    assert base.input_labels(dataclasses.replace(img, apt_releases=resigned)) == labels
    img.packages = {"bash": "5.2", "zlib1g": "1:1.3"}  # the order they were read in does not count
    assert base.input_labels(img) == labels
    img.packages["bash"] = "5.3"
    assert base.input_labels(img)["dedal.base.packages.sha256"] != labels["dedal.base.packages.sha256"]
    old = base.BaseImage.from_json({**img.to_json(), "apt_releases": None})  # a base.json from before
    assert base.input_labels(old) == base.input_labels(img)


def test_components_default_and_identity(tmp_path):
    d = base.load_definition("debian-trixie")
    assert d.components == ["main"] and d.to_json()["components"] == ["main"]
    more = tmp_path / "debian-trixie.yaml"
    more.write_text(d.text + "components: [main, contrib, non-free, non-free-firmware]\n")
    m = base.load_definition(str(more))
    assert m.components == ["main", "contrib", "non-free", "non-free-firmware"]
    # another component list is another base (its packages may come from the new areas)
    assert base.definition_id(m) != base.definition_id(d)
    fewer = tmp_path / "fewer" / "debian-trixie.yaml"
    fewer.parent.mkdir()
    fewer.write_text(d.text + "components: [main, contrib]\n")
    assert base.definition_id(base.load_definition(str(fewer))) not in (base.definition_id(d), base.definition_id(m))


@pytest.mark.parametrize(
    "value, message",
    [
        (
            "[main, universe]",
            "components: unknown 'universe' (Debian's are main, contrib, non-free, non-free-firmware)",
        ),
        ("[contrib, non-free]", "components: must include main"),
        ("[main, contrib, main]", "names one twice"),
        ("main contrib", "components: expected list"),
        ("[main, 3]", "components: unknown 3"),
    ],
)
def test_bad_components(tmp_path, value, message):
    p = tmp_path / "bad.yaml"
    p.write_text(f"suite: trixie\ncomponents: {value}\n")
    with pytest.raises(UserError) as exc:
        base.load_definition(str(p))
    assert message in str(exc.value)


def test_write_sources_components(tmp_path):
    (tmp_path / "etc/apt").mkdir(parents=True)
    (tmp_path / "etc/apt/sources.list").write_text("deb http://old.example/debian trixie main\n")
    debootstrap.write_sources(
        tmp_path,
        "trixie",
        "http://mirror.example/debian",
        updates=True,
        security="http://mirror.example/debian-security",
        components=["main", "contrib", "non-free"],
    )
    text = (tmp_path / "etc/apt/sources.list.d/debian.sources").read_text()
    stanzas = [dict(line.split(": ", 1) for line in s.splitlines()) for s in text.strip().split("\n\n")]
    assert stanzas == [
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian",
            "Suites": "trixie trixie-updates",
            "Components": "main contrib non-free",
            "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
        },
        {
            "Types": "deb",
            "URIs": "http://mirror.example/debian-security",
            "Suites": "trixie-security",
            "Components": "main contrib non-free",
            "Signed-By": "/usr/share/keyrings/debian-archive-keyring.gpg",
        },
    ]
    assert not (tmp_path / "etc/apt/sources.list").exists()
    # what apt reads back is what was written (the host-sources parser is the same deb822 reader)
    assert debootstrap.host_sources(tmp_path / "etc/apt")[0]["suites"] == ["trixie", "trixie-updates"]
    debootstrap.write_sources(tmp_path, "trixie", "http://mirror.example/debian", updates=False, security=None)
    assert "Components: main\n" in (tmp_path / "etc/apt/sources.list.d/debian.sources").read_text()
    assert text.count("Types: deb") == 2


def test_cuda_base_definition():
    """The GPU build base: trixie with contrib/non-free for CUDA 12.4 and NCCL, GCC 13 next
    to GCC 14 (nvcc 12.4 takes GCC up to 13), Spack's prerequisites and clingo as the
    default base has them."""
    d = base.load_definition("debian-trixie-cuda")
    default = base.load_definition("debian-trixie")
    assert (d.kind, d.suite, d.variant, d.updates, d.security) == ("debian", "trixie", "minbase", True, True)
    assert d.components == ["main", "contrib", "non-free"]
    assert d.packages["cuda"] == [
        "nvidia-cuda-toolkit",
        "nvidia-cuda-toolkit-gcc",
        "nvidia-cuda-dev",
        "libcudart12",
        "libnccl2",
        "libnccl-dev",
    ]
    assert d.packages["cuda_compiler"] == ["gcc-13", "g++-13", "gfortran-13"]
    assert d.packages["build"] == default.packages["build"]
    assert d.packages["spack_externals"] == default.packages["spack_externals"]
    assert d.python_venv == default.python_venv and d.env == default.env
    assert (d.record_versions["cuda"], d.record_versions["nccl"]) == ("nvidia-cuda-toolkit", "libnccl2")
    assert {"nvcc", "gcc13"} <= set(d.probe_versions)
    assert base.definition_id(d).startswith("debian-trixie-cuda-")
    # the GPU environment builds on it, with its CUDA as an external
    gpu = load_env(ROOT / "spack-envs" / "esd-gpu" / "env.yaml")
    assert gpu.base_image == "debian-trixie-cuda"
    cuda = gpu.spack_yaml()["spack"]["packages"]["cuda"]
    assert cuda["buildable"] is False and cuda["externals"] == [{"spec": "cuda@12.4.131", "prefix": "/usr"}]


@pytest.mark.reliability
def test_sigterm_during_a_base_build_stops_debootstrap_and_leaves_nothing(tmp_path, isolated_env):
    """scancel or a CI timeout (SIGTERM) while debootstrap runs: dedal exits 143, its
    debootstrap is gone and no half-made root filesystem stays in the base cache (before,
    debootstrap went on downloading and its `.build-*` directory stayed)."""
    if os.geteuid() != 0:
        pytest.skip("building a base needs root")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    pidfile = tmp_path / "debootstrap.pid"
    stand_in = bindir / "debootstrap"  # stand-in: a debootstrap that never finishes
    stand_in.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 300\n")
    stand_in.chmod(0o755)
    defs = tmp_path / "defs"
    defs.mkdir()
    (defs / "slow.yaml").write_text("suite: trixie\nmirror: http://127.0.0.1:9/debian\npackages: [gcc]\n")
    cache = tmp_path / "cache"
    env = dict(
        isolated_env,
        PATH=f"{bindir}:{os.environ['PATH']}",
        DEDAL_BASE_IMAGES_DIR=str(defs),
        DEDAL_BASE_CACHE=str(cache),
    )
    dedal = subprocess.Popen(
        [dedal_exe(), "base", "build", "slow"], env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text().strip():
        assert dedal.poll() is None and time.monotonic() < deadline, dedal.communicate()
        time.sleep(0.1)
    child = int(pidfile.read_text())
    assert list(cache.glob(".build-*"))
    dedal.send_signal(signal.SIGTERM)
    out, err = dedal.communicate(timeout=60)
    assert dedal.returncode == 143, out + err
    said = [line for line in err.splitlines() if line.startswith(("dedal: error:", "dedal: base"))]
    assert said == ["dedal: base slow interrupted by signal SIGTERM"] and "Traceback" not in err, err
    gone = time.monotonic() + 10
    while Path(f"/proc/{child}").exists() and time.monotonic() < gone:
        time.sleep(0.1)
    assert not Path(f"/proc/{child}").exists(), "debootstrap outlived dedal"
    assert not list(cache.glob(".build-*")) and not (cache / "slow").exists()


def _fake_base(root: Path, name: str, status: str, *, os_version: str = "13", arch: str = "amd64") -> base.BaseImage:
    """A built base as base.json has it, its packages read from a fake dpkg status file."""
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(status)
    return base.BaseImage(
        name=name,
        id=f"{name}-0",
        path=root,
        kind="debian",
        arch=arch,
        os_release={"ID": "debian", "VERSION_ID": os_version},
        versions={},
        packages=debootstrap.installed_packages(root),
    )


def _stanza(name: str, version: str) -> str:
    return f"Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n\n"


BUILD_STATUS = "".join(
    _stanza(n, v)
    for n, v in (
        ("libc6", "2.41-12+deb13u5"),
        ("libzstd1", "1.5.7+dfsg-1+deb13u1"),
        ("nvidia-cuda-dev", "12.4.127~12.4.1-2"),
        ("libcudart12", "12.4.127~12.4.1-2"),
        ("libcuda1", "550.163.01-2"),
    )
)


def test_runtime_base_must_share_the_build_bases_versions(tmp_path):
    """A runtime base is its build base's twin: every package both hold in one version (from
    the fake dpkg databases), the same OS release and architecture; else one UserError that
    names the packages and both versions."""
    build = _fake_base(tmp_path / "build", "cuda", BUILD_STATUS)
    twin = _fake_base(
        tmp_path / "twin",
        "cuda-runtime",
        "".join(
            _stanza(n, v)
            for n, v in (
                ("libc6", "2.41-12+deb13u5"),
                ("libzstd1", "1.5.7+dfsg-1+deb13u1"),
                ("libcudart12", "12.4.127~12.4.1-2"),
                ("python3", "3.13.5-1"),
            )
        ),
    )
    assert base.package_mismatches(build.packages, twin.packages) == []
    assert base.check_runtime_base(build, twin) == 3  # libc6, libzstd1, libcudart12 compared

    # debootstrap's libzstd1 where the build base got trixie-updates' (the real case that made
    # debian-trixie-cuda-runtime name libzstd1)
    older = _fake_base(tmp_path / "older", "cuda-runtime", BUILD_STATUS.replace("1.5.7+dfsg-1+deb13u1", "1.5.7+dfsg-1"))
    assert base.package_mismatches(build.packages, older.packages) == [
        ("libzstd1", "1.5.7+dfsg-1+deb13u1", "1.5.7+dfsg-1")
    ]
    with pytest.raises(UserError) as exc:
        base.check_runtime_base(build, older)
    msg = exc.value.one_line()
    assert (
        "1 of the 5 packages they share differ in version: libzstd1 1.5.7+dfsg-1+deb13u1 (build) vs "
        "1.5.7+dfsg-1 (runtime)" in msg
    )
    assert "dedal base build cuda-runtime --rebuild" in msg and "\n" not in msg

    other_os = _fake_base(tmp_path / "bookworm", "cuda-runtime", BUILD_STATUS, os_version="12")
    with pytest.raises(UserError, match="debian12/amd64 vs debian13/amd64"):
        base.check_runtime_base(build, other_os)
    strangers = _fake_base(tmp_path / "none", "cuda-runtime", _stanza("busybox", "1"))
    with pytest.raises(UserError, match="share no package"):
        base.check_runtime_base(build, strangers)


def test_runtime_base_name():
    """No runtime_base (or the build base itself): the build base; a known definition: it;
    an unknown one, or host on either side: one UserError."""
    assert base.runtime_base_name("debian-trixie-cuda", None) == "debian-trixie-cuda"
    assert base.runtime_base_name("debian-trixie-cuda", "debian-trixie-cuda") == "debian-trixie-cuda"
    assert base.runtime_base_name("debian-trixie-cuda", "debian-trixie-cuda-runtime") == "debian-trixie-cuda-runtime"
    with pytest.raises(UserError, match="unknown base image 'nope'; known: .*debian-trixie-cuda-runtime"):
        base.runtime_base_name("debian-trixie-cuda", "nope")
    for build, runtime in (("host", "debian-trixie"), ("debian-trixie", "host")):
        with pytest.raises(UserError, match="a runtime base goes with a base image, not with base host"):
            base.runtime_base_name(build, runtime)


def test_cuda_runtime_base_definition():
    """The GPU runtime base: the build base's suite, mirror and archive areas, the CUDA
    runtime and math libraries, NCCL, the compilers' and rdma-core's runtime libraries;
    neither the toolkit nor the development tree nor the driver's own libraries."""
    rt = base.load_definition("debian-trixie-cuda-runtime")
    build = base.load_definition("debian-trixie-cuda")
    for key in ("suite", "variant", "arch", "mirror", "updates", "security", "components"):
        assert getattr(rt, key) == getattr(build, key), key
    pkgs = rt.all_packages
    for p in (
        "libcudart12",
        "libnccl2",
        "libcublas12",
        "libcublaslt12",
        "libcufft11",
        "libcurand10",
        "libcusolver11",
        "libcusparse12",
        "libstdc++6",
        "libgcc-s1",
        "libgfortran5",
        "libibverbs1",
        "librdmacm1t64",
        "ibverbs-providers",
        "python3",
        "hwloc-nox",
        "numactl",
    ):
        assert p in pkgs, p
    for p in ("nvidia-cuda-toolkit", "nvidia-cuda-dev", "libnccl-dev", "libcuda1", "libnvidia-ml1", "gcc", "gcc-13"):
        assert p not in pkgs, p
    assert not rt.python_venv and "SPACK_PYTHON" not in rt.env  # no concretizing in an image
    assert rt.record_versions["cudart"] == build.record_versions["cudart"] == "libcudart12"


def test_a_debian_base_is_built_as_root_and_a_user_is_told_the_way_out(tmp_path):
    """Who is not root cannot debootstrap: said before anything is made, naming base_cache,
    the setting that lets such a user take the base root built; not said for root, nor for
    a base that Apptainer builds (fakeroot)."""
    defn = base.load_definition("debian-trixie")
    cache = tmp_path / "cache"
    with pytest.raises(UserError) as info:
        check_can_build(defn, cache, euid=1000)
    said = info.value.one_line()
    assert f"base debian-trixie: it is not in base_cache {cache}, and building it needs root" in said
    assert "dedal base build debian-trixie" in said and "DEDAL_BASE_CACHE" in said
    with pytest.raises(UserError, match="base debian-trixie: rebuilding it needs root"):
        check_can_build(defn, cache, rebuild=True, euid=1000)
    check_can_build(defn, cache, euid=0)
    check_can_build(base.load_definition("rocky9-cuda"), cache, euid=1000)
    assert not cache.exists()


def test_dedal_base_build_as_a_user_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """The command as a user who is not root (its uid as the kernel would give it): exit 2,
    the one line, the cache untouched (a user's run left a lock file and a logs folder in it,
    after a line naming a log never written)."""
    from dedal import cli

    for var in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.setenv(var, str(tmp_path / "home"))
    monkeypatch.setenv("DEDAL_BASE_CACHE", str(tmp_path / "bases"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert cli.main(["base", "build", "debian-trixie"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"base debian-trixie: it is not in base_cache {tmp_path / 'bases'}, and building it needs root" in err
    assert sorted(tmp_path.iterdir()) == [], sorted(tmp_path.rglob("*"))
