"""`dedal build-image` end to end on a test environment: fetch, build (inside the Debian
trixie base), assemble, verify (the bundled benchmarks, native and in the container),
publish to a real local registry, pull back; a second run does no work. The first run is
typed in a terminal (tests/fixtures/terminal.py).

Uses a real Spack when DEDAL_SPACK_ROOT holds one (and the stand-in otherwise)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from dedal.model.artifacts import sha256_file
from tests.conftest import SPACK_DATA, dedal_exe, fill_tiny_mirror, is_real_spack
from tests.fixtures.terminal import in_terminal
from tests.standin import install_standin

pytestmark = [pytest.mark.e2e, pytest.mark.registry]


def _real_spack() -> str:
    """DEDAL_SPACK_ROOT when it holds a real Spack, else "" (then the stand-in plays it)."""
    root = os.environ.get("DEDAL_SPACK_ROOT", "")
    return root if is_real_spack(Path(root) if root else None) else ""


@pytest.fixture
def e2e_env(tmp_path: Path, registry):  # noqa: F811
    if os.geteuid() != 0:
        pytest.skip("needs root (bubblewrap over the base, squashfs mounts)")
    envdir = tmp_path / "env"
    envdir.mkdir()
    real = _real_spack()
    doc = {
        "spack": {"specs": ["dedal-app"], "concretizer": {"unify": True}},
        "dedal": {
            "name": "tiny",
            "tag": "e2e",
            "base_image": "debian-trixie",
            "install_root": "/opt/esd/software",
            "registry": registry.ref("test/tiny"),
            # the checks run for real; thresholds wide open: this 2-core machine is noisy
            "verify": {
                "ranks": 2,
                "repetitions": 1,
                "benchmarks": ["init", "latency"],
                "thresholds": {"latency_overhead_us": 1000, "bandwidth_pct": 1000, "init_overhead_pct": 1000},
            },
        },
    }
    if real:
        # the real Spack concretizes in the base; the recorded tiny repo needs its sources in a mirror
        doc["spack"]["repos"] = [str(SPACK_DATA / "tiny-repo" / "repo")]
        # build tools from the base image (no sources for them in the offline mirror)
        doc["spack"]["packages"] = {
            "all": {"require": "target=x86_64_v3"},
            "gmake": {"buildable": False, "externals": [{"spec": "gmake@4.4.1", "prefix": "/usr"}]},
        }
        spack_root = Path(real)
        mirror = fill_tiny_mirror(tmp_path / "mirror")
    else:
        shutil.copyfile(SPACK_DATA / "tiny-dedal.spack.lock", envdir / "spack.lock")  # the stand-in cannot concretize
        spack_root = install_standin(tmp_path / "spack")
        mirror = tmp_path / "mirror"
    (envdir / "env.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    env = {
        "DEDAL_DATA_DIR": str(tmp_path / "data"),
        "DEDAL_SPACK_ROOT": str(spack_root),
        "DEDAL_MIRROR": str(mirror),
        "DEDAL_STAGE_DIR": str(tmp_path / "stage"),
        "DEDAL_REGISTRY_INSECURE": "true",
    }
    (tmp_path / "stage").mkdir()
    return envdir / "env.yaml", env, registry


def test_build_image_end_to_end_then_nothing_to_do(run_dedal, isolated_env, e2e_env, tmp_path):
    env_file, env, reg = e2e_env
    # typed in a terminal (stdin and stderr; stdout to a pipe for the JSON), as a person runs it:
    # Spack's log writer in a build job failed on an inherited terminal
    term = in_terminal(
        [dedal_exe(), "build-image", str(env_file), "--json"],
        dict(isolated_env, **env),
        timeout=1800,
        cwd=tmp_path,
        stdout_pipe=True,
    )
    assert term.rc == 0, term.stdout[-3000:] + term.text[-3000:]
    summary = json.loads(term.stdout)
    stages = {s["name"]: s for s in summary["stages"]}
    assert [stages[s]["status"] for s in ("fetch", "build", "assemble", "verify", "publish")] == [
        "done",
        "done",
        "done",
        "done",
        "done",
    ], stages
    assert summary["layers_built"] == 5 and summary["ok"]
    image = Path(summary["image"])
    assert image.is_file() and summary["image_sha256"] == sha256_file(image)
    assert summary["verdict"] in ("good", "suboptimal")
    report = json.loads((Path(summary["report"]).parent / "verify.json").read_text())
    assert report["verdict"] == summary["verdict"] and report["checks"]
    # the image's own `apptainer test` ran in the container and passed (its line in the log)
    own = next(c for c in report["checks"] if c["name"] == "app apptainer-test")
    assert own["verdict"] == "good", own
    assert "tiny:e2e: all " in own["findings"][0]["message"]
    assert summary["published"] == [reg.ref("test/tiny:e2e")]

    # the registry holds exactly the SIF, as Apptainer expects, and pulls back byte for byte
    manifest = reg.manifest("test/tiny", "e2e").json()
    assert manifest["layers"][0]["mediaType"] == "application/vnd.sylabs.sif.layer.v1.sif"
    assert manifest["layers"][0]["digest"] == "sha256:" + summary["image_sha256"]
    pulled = tmp_path / "pulled.sif"
    res = run_dedal("pull", reg.ref("test/tiny:e2e"), "-o", str(pulled), "--insecure", env=env)
    assert res.returncode == 0, res.stderr
    assert sha256_file(pulled) == summary["image_sha256"]
    # the image runs: the package built by the layer stage, from the view
    res = run_dedal("exec", str(pulled), "--", "dedal-app", env=env)
    expected = "hello from libdedal 1.0" if _real_spack() else "dedal-app 1.0 ok"  # the real recipe / the stand-in
    assert res.returncode == 0 and expected in res.stdout, res.stdout + res.stderr

    # second run: every stage is current, nothing rebuilt, nothing uploaded again
    again = run_dedal("build-image", str(env_file), "--json", env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    second = json.loads(again.stdout)
    st = {s["name"]: s for s in second["stages"]}
    assert [st[s]["status"] for s in ("fetch", "build", "assemble", "verify")] == ["current"] * 4, st
    assert second["layers_built"] == 0 and second["layers_reused"] == 5
    assert second["image_sha256"] == summary["image_sha256"]
    assert "(0 blob(s) uploaded)" in st["publish"]["detail"]


def test_failed_verification_is_not_published(run_dedal, e2e_env, tmp_path):
    env_file, env, reg = e2e_env
    res = run_dedal(
        "build-image",
        str(env_file),
        "--verify-env",
        "UCX_TLS=tcp",
        "--verify-env",
        "OMPI_MCA_pml=ucx",
        "--verify-env",
        "OMPI_MCA_pml_ucx_tls=any",
        "--verify-env",
        "OMPI_MCA_pml_ucx_devices=any",
        "--json",
        env=env,
        timeout=1800,
    )
    assert res.returncode == 1, f"exit {res.returncode}\n{res.stdout[-2000:]}\n{res.stderr[-3000:]}"
    summary = json.loads(res.stdout)
    stages = {s["name"]: s for s in summary["stages"]}
    assert stages["verify"]["status"] == "failed" and "verdict bad" in stages["verify"]["detail"]
    assert stages["publish"]["status"] == "pending" and "not run" in stages["publish"]["detail"]
    assert "verify:" in res.stderr and "not published" in res.stderr
    assert reg.api("GET", "/v2/test/tiny/tags/list").status_code == 404
