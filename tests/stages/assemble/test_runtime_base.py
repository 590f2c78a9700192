"""An image assembled on a runtime base: the tiny environment built on the CUDA build base
(debian-trixie-cuda: toolkit, development tree, GCC 13) and assembled on its runtime twin
(debian-trixie-cuda-runtime), both real debootstrapped bases (built here when missing:
minutes, network to the Debian mirror)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dedal.adapters import squashfs
from dedal.model import sif
from tests.fixtures import base as helpers
from tests.fixtures.images import SDE, TINY_RUNTIME, build_env, partition_file, require_root

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.timeout(3 * 3600)]  # two bases built when not cached
BUILD, RUNTIME = "debian-trixie-cuda", "debian-trixie-cuda-runtime"


@pytest.fixture(scope="module")
def bases():
    from dedal.stages.base import ensure_base

    require_root()
    helpers.require_tools("debootstrap", "bwrap", "mksquashfs", "squashfuse")
    s = helpers.settings(debian_mirror=os.environ.get("DEDAL_DEBIAN_MIRROR", ""))
    return ensure_base(BUILD, s, progress=print), ensure_base(RUNTIME, s, progress=print)


@pytest.fixture(scope="module")
def gpu_env(tmp_path_factory, bases):
    return build_env(tmp_path_factory.mktemp("asm-cuda"), "tinycuda", BUILD, {"runtime_base": RUNTIME})


@pytest.fixture(scope="module")
def gpu_image(gpu_env) -> dict:
    return gpu_env.assemble_json(env={"SOURCE_DATE_EPOCH": SDE})


def test_image_carries_the_runtime_base_not_the_build_base(gpu_env, gpu_image, bases):
    build, runtime = bases
    assert (gpu_image["base_id"], gpu_image["runtime_base"], gpu_image["runtime_base_id"]) == (
        build.id,
        RUNTIME,
        runtime.id,
    )
    # smaller than the build base itself: the toolkit and development tree stay out
    assert gpu_image["squashfs_size"] < build.squashfs_bytes / 2
    raw = partition_file(Path(gpu_image["image"]), gpu_env.root / "part.sqfs")
    paths = {e["path"] for e in squashfs.entries(raw)}
    raw.unlink()
    for p in (
        "usr/lib/x86_64-linux-gnu/libcudart.so.12",
        "usr/lib/x86_64-linux-gnu/libnccl.so.2",
        "usr/lib/x86_64-linux-gnu/libcublas.so.12",
        "opt/view",
        "opt/dedal/env/runtime-base.yaml",
        "opt/dedal/env/base.yaml",
    ):
        assert p in paths, p
    for p in (
        "usr/bin/nvcc",
        "usr/include/cuda_runtime.h",
        "usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "usr/bin/gcc-13",
    ):
        assert p not in paths, p
    closure = gpu_image["elf_closure"]
    assert closure["missing"] == {} and closure["checked"] >= 3


def test_labels_sbom_and_manifest_name_both_bases(gpu_env, gpu_image, bases):
    build, runtime = bases
    labels = gpu_image["labels"]
    assert (labels["dedal.base.image"], labels["dedal.base.id"]) == (BUILD, build.id)
    assert (labels["dedal.runtime_base.image"], labels["dedal.runtime_base.id"]) == (RUNTIME, runtime.id)
    assert labels["dedal.runtime_base.sha256"] != labels["dedal.base.sha256"]
    assert json.loads(labels["dedal.runtime_base.versions"])["cudart"] == build.versions["cudart"]
    assert json.loads(labels["dedal.base.versions"])["nvcc"] == build.versions["nvcc"]
    assert int(labels["dedal.runtime_base.shared_packages"]) > 50
    assert labels["dedal.runtime_base.packages.count"] == str(len(runtime.packages))
    assert labels["dedal.base.packages.count"] == str(len(build.packages))
    sbom = json.loads(Path(gpu_image["sbom"]).read_text())
    props = {p["name"]: p["value"] for p in sbom["metadata"]["properties"]}
    assert props["dedal:base_id"] == build.id and props["dedal:runtime_base_id"] == runtime.id
    manifest = json.loads(Path(gpu_image["image_json"]).read_text())
    assert manifest["base"]["id"] == build.id and manifest["runtime_base"]["id"] == runtime.id
    meta = sif.read_json_object(
        Path(gpu_image["image"]), sif.read_sif(Path(gpu_image["image"])).by_type(sif.DATA_LABELS)[0]
    )
    assert meta == labels
    inspect = json.loads(gpu_env.dedal("inspect", gpu_image["image"], "--json").stdout)
    assert sorted(layer["name"] for layer in inspect["layers"]) == sorted(TINY_RUNTIME)


def test_program_runs_on_the_runtime_base(gpu_env, gpu_image):
    r = gpu_env.dedal("exec", gpu_image["image"], "--", "dedal-app")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "dedal-app 1.0 ok 4"
