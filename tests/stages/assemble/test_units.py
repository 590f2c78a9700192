"""The assembler's model code without any tool: selection, layer audit rules, the
environment script made from `spack env activate --sh`, labels, the SBOM."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dedal.stages import assemble as asm
from dedal.stages.assemble import apptainer_files, metadata
from dedal.model import sbom
from dedal.errors import UserError
from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from tests.conftest import SPACK_DATA

IR = "/opt/esd/software"
PREFIX = "libdedal-1.0-suuk3yz4xpajdofpjlxvqkx3ldb7j6sm"


@pytest.fixture(scope="module")
def tiny_plan():
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    return make_plan(lock, env_name="t", install_root=IR, base_image="host", base_id="host:test")


@pytest.fixture(scope="module")
def mpi_plan():
    lock = load_lock(SPACK_DATA / "mpi-cuda-pure.spack.lock")
    return make_plan(lock, env_name="mpi", install_root=IR, base_image="host", base_id="host:test")


def names(plan, hashes):
    return sorted(plan.nodes[h].name for h in hashes)


# ----------------------------------------------------------------------------- selection
def test_runtime_closure_drops_build_only(tiny_plan):
    roots, hashes = asm.select_packages(tiny_plan)
    assert names(tiny_plan, roots) == ["dedal-app"]
    assert names(tiny_plan, hashes) == ["dedal-app", "gcc-runtime", "glibc", "libdedal"]
    # dependencies first (layers extract in this order), externals last
    order = [tiny_plan.nodes[h].name for h in hashes]
    assert order.index("gcc-runtime") < order.index("libdedal") < order.index("dedal-app")


def test_keep_build_deps(tiny_plan):
    _roots, hashes = asm.select_packages(tiny_plan, keep_build_deps=True)
    assert {"dedal-tool", "dedal-bootstrap", "gmake"} <= set(names(tiny_plan, hashes))


def test_only_by_name_version_and_hash(tiny_plan):
    roots, hashes = asm.select_packages(tiny_plan, only=["libdedal"])
    assert names(tiny_plan, roots) == ["libdedal"]
    assert names(tiny_plan, hashes) == ["gcc-runtime", "glibc", "libdedal"]
    assert asm.select_packages(tiny_plan, only=["libdedal@1.0"])[0] == roots
    assert asm.select_packages(tiny_plan, only=["/suuk3yz"])[0] == roots


@pytest.mark.parametrize(
    "spec,msg", [("nosuch", "no such package"), ("libdedal@9", "no such package"), ("dedal-tool", "no such package")]
)  # build-only: not in the image
def test_only_refuses_unknown(tiny_plan, spec, msg):
    with pytest.raises(UserError, match=msg):
        asm.select_packages(tiny_plan, only=[spec])


def test_only_subset_of_a_real_env(mpi_plan):
    _all_roots, everything = asm.select_packages(mpi_plan)
    roots, subset = asm.select_packages(mpi_plan, only=["openmpi"])
    assert names(mpi_plan, roots) == ["openmpi"]
    assert set(subset) < set(everything)
    assert "openmpi" in names(mpi_plan, subset) and "ucx" in names(mpi_plan, subset)
    for h in subset:  # closed under link/run dependencies
        for child, types in mpi_plan.nodes[h].deps.items():
            if {"link", "run"} & set(types):
                assert child in subset


# ----------------------------------------------------------------------------- layer audit
@pytest.mark.parametrize(
    "entry,problem",
    [
        ({"path": PREFIX, "mode": "drwxr-xr-x"}, None),
        ({"path": f"{PREFIX}/lib/libx.so", "mode": "-rwxr-xr-x"}, None),
        ({"path": f"{PREFIX}/lib/a.so", "mode": "lrwxrwxrwx", "target": "libx.so"}, None),
        ({"path": f"{PREFIX}/lib/b.so", "mode": "lrwxrwxrwx", "target": f"{IR}/gcc-runtime-1/lib/libgcc.so"}, None),
        ({"path": f"{PREFIX}/share/c", "mode": "lrwxrwxrwx", "target": "../../other-prefix/share/c"}, None),
        ({"path": "evil", "mode": "-rw-r--r--"}, "outside its prefix"),
        ({"path": f"{PREFIX}-x/file", "mode": "-rw-r--r--"}, "outside its prefix"),
        ({"path": f"{PREFIX}/../evil", "mode": "-rw-r--r--"}, "outside its prefix"),
        ({"path": f"{PREFIX}/dev/sda", "mode": "brw-r--r--"}, "device node"),
        ({"path": f"{PREFIX}/etc/passwd", "mode": "lrwxrwxrwx", "target": "/etc/passwd"}, "outside the install root"),
        (
            {"path": f"{PREFIX}/x", "mode": "lrwxrwxrwx", "target": "/opt/esd/software-evil/x"},
            "outside the install root",
        ),
        ({"path": f"{PREFIX}/up", "mode": "lrwxrwxrwx", "target": "../../../etc"}, "escapes the install root"),
        ({"path": f"{PREFIX}/a/b", "mode": "lrwxrwxrwx", "target": "../../../../../../root"}, "escapes"),
    ],
)
def test_entry_rules(entry, problem):
    found = asm.entry_problem(entry, PREFIX, IR)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


# ----------------------------------------------------------------------------- environment script
RECORDED_ACTIVATE = (SPACK_DATA / "tiny-dedal.activate.sh").read_text()
RECORDED_PATH = (
    "/srv/probe/venv/bin:/srv/spack/bin:/usr/local/go/bin:/root/go/bin:/root/.cargo/bin:"
    "/root/.pyenv/plugins/pyenv-virtualenv/shims:/root/.pyenv/shims:/root/.pyenv/bin:"
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)


def test_activation_of_real_spack_output():
    script = asm.activation_script(RECORDED_ACTIVATE, {"PATH": RECORDED_PATH})
    assert "SPACK_ENV" not in script and "despacktivate" not in script and "alias" not in script
    assert 'export PATH=/dev/shm/spack-view/bin"${PATH:+:$PATH}"' in script
    assert "/srv/spack/bin" not in script  # the build host's PATH is not baked in
    assert 'export CMAKE_PREFIX_PATH=/dev/shm/spack-view"${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"' in script
    assert (
        'export MANPATH=/usr/share/man:/dev/shm/spack-view/share/man:/dev/shm/spack-view/man:"${MANPATH:-}"' in script
    )


def run_sh(script: str, env: dict, show: str) -> str:
    return subprocess.run(
        ["/bin/sh", "-c", script + f'\nprintf "%s" "${show}"'], env=env, text=True, capture_output=True, check=True
    ).stdout


def test_activation_script_runs_in_sh():
    text = (
        "export SPACK_ENV=/opt/dedal/env;\nexport SPACK_ENV_VIEW=default;\nalias despacktivate='spack env deactivate';\n"
        "export PATH=/opt/view/bin:/usr/bin:/bin;\nexport DEDAL_HOME=/opt/view;\n"
        "export LD_LIBRARY_PATH=/opt/view/lib;\nexport NOTE='two words';\n"
    )
    script = asm.activation_script(text, {"PATH": "/usr/bin:/bin"})
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin"}
    assert run_sh(script, env, "PATH") == "/opt/view/bin:/usr/local/bin:/usr/bin:/bin"
    assert run_sh(script, env, "DEDAL_HOME") == "/opt/view"
    assert run_sh(script, env, "LD_LIBRARY_PATH") == "/opt/view/lib"
    assert run_sh(script, {**env, "LD_LIBRARY_PATH": "/x"}, "LD_LIBRARY_PATH") == "/opt/view/lib:/x"
    assert run_sh(script, env, "NOTE") == "two words"
    assert run_sh(script, env, "SPACK_ENV") == ""


def test_activation_with_deduplicated_path():
    # Spack (and the stand-in) drop duplicates of the caller's PATH: still only the new part is kept
    text = "export PATH=/opt/view/bin:/a:/b;\n"
    assert 'export PATH=/opt/view/bin"${PATH:+:$PATH}"' in asm.activation_script(text, {"PATH": "/a:/a:/b"})


# ----------------------------------------------------------------------------- files, labels, versions
def test_runscripts():
    assert asm.runscript_text("") == asm.DEFAULT_RUNSCRIPT
    assert asm.runscript_text("exec foo") == "#!/bin/sh\nexec foo\n"
    assert asm.runscript_text("#!/bin/bash\necho hi") == "#!/bin/bash\necho hi\n"


def test_versions_from_base_and_layers(tiny_plan, mpi_plan):
    class Base:
        versions = {"openmpi": "5.0.7-1", "pmix": "5.0.7-1", "ucx": "1.18.1+ds-2+b1", "gcc": "14.2.0"}

    _r, hashes = asm.select_packages(tiny_plan)
    versions, sources = metadata.image_versions(tiny_plan, hashes, Base())
    assert versions == {"openmpi": "5.0.7", "pmix": "5.0.7", "ucx": "1.18.1"}
    assert sources["openmpi"] == "base package 5.0.7-1"
    _r, hashes = asm.select_packages(mpi_plan)
    versions, sources = metadata.image_versions(mpi_plan, hashes, Base())
    spack_versions = {mpi_plan.nodes[h].name: mpi_plan.nodes[h].version for h in hashes}
    for comp in ("openmpi", "pmix", "ucx", "cuda"):
        if comp in spack_versions:  # a Spack package of the image wins over the base
            assert versions[comp] == spack_versions[comp] and sources[comp] in ("spack", "external")


def test_user_labels_cannot_override_provenance(tiny_plan):
    contents = metadata.Contents(tiny_plan, [], tiny_plan.roots)
    with pytest.raises(UserError, match="provenance label"):
        metadata.make_labels(contents, 0, "", {"dedal.env": "x"})
    labels = metadata.make_labels(contents, 1700000000, "d", {"team": "x"})
    assert labels["team"] == "x" and labels["org.label-schema.build-date"] == "2023-11-14T22:13:20Z"
    assert all(isinstance(v, str) for v in labels.values())  # Apptainer's labels are strings


# ----------------------------------------------------------------------------- SBOM
def test_sbom_from_lock(tiny_plan):
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    _roots, hashes = asm.select_packages(tiny_plan)
    layers = {
        h: {"key": tiny_plan.nodes[h].key, "sha256": "ab" * 32, "size": 4096}
        for h in hashes
        if not tiny_plan.nodes[h].external
    }
    doc = sbom.make_sbom(tiny_plan, hashes, layers=layers, lock=lock, created=1700000000)
    again = sbom.make_sbom(tiny_plan, list(reversed(hashes)), layers=layers, lock=lock, created=1700000000)
    assert sbom.dumps(doc) == sbom.dumps(again)  # deterministic, independent of input order
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.5"
    assert doc["serialNumber"].startswith("urn:uuid:")
    assert doc["metadata"]["timestamp"] == "2023-11-14T22:13:20Z"
    props = {p["name"]: p["value"] for p in doc["metadata"]["properties"]}
    assert props["dedal:lock_sha256"] == tiny_plan.lock_sha256 and props["spack:commit"] == tiny_plan.spack_commit
    comps = {c["name"]: c for c in doc["components"]}
    assert sorted(comps) == ["dedal-app", "gcc-runtime", "glibc", "libdedal"]
    app = comps["dedal-app"]
    assert app["type"] == "application" and app["bom-ref"] == "jqiwi5fvmfnuwwespap26l5ducyj4evg"
    assert app["purl"] == (
        "pkg:spack/dedal-app@1.0?arch=linux-debian12-x86_64_v3"
        "&hash=jqiwi5fvmfnuwwespap26l5ducyj4evg&namespace=dedaltest"
    )
    assert app["hashes"] == [{"alg": "SHA-256", "content": "ab" * 32}]
    glibc = {p["name"]: p["value"] for p in comps["glibc"]["properties"]}
    assert (
        glibc["spack:external"] == "true" and glibc["spack:external_path"] == "/usr" and "hashes" not in comps["glibc"]
    )
    deps = {d["ref"]: d["dependsOn"] for d in doc["dependencies"]}
    assert deps["image"] == [app["bom-ref"]]
    assert sorted(tiny_plan.nodes[h].name for h in deps[app["bom-ref"]]) == ["gcc-runtime", "glibc", "libdedal"]
    json.loads(sbom.dumps(doc))


def test_purl_encoding():
    assert sbom.purl("py-foo", "1.0+local", {"hash": "abc", "arch": ""}) == "pkg:spack/py-foo@1.0%2Blocal?hash=abc"


# ----------------------------------------------------------------------------- SIF written in place
def test_sif_in_place_equals_copied(tmp_path):
    """mksquashfs -offset at sif.partition_offset + write_sif(in_place=True) gives the bytes
    of the copying writer (what the assembler relies on to skip the copy)."""
    from dedal.model import sif
    from dedal.adapters import squashfs

    src = tmp_path / "root"
    (src / "etc").mkdir(parents=True)
    (src / "etc" / "os-release").write_text("ID=t\n")
    (src / "blob").write_bytes(bytes(range(256)) * 1000)
    objs = dict(
        definition="Bootstrap: dedal\n",
        labels={"a": "b"},
        metadata={"type": "container"},
        sbom=b'{"bomFormat": "CycloneDX"}\n',
    )
    plain = tmp_path / "plain.sqfs"
    squashfs.pack([src], plain)
    copied = sif.write_sif(tmp_path / "copied.sif", plain, created=1700000000, **objs)
    offset = sif.partition_offset(**objs)
    assert offset % 4096 == 0 and offset == sif.primary_partition(copied).offset
    inplace = tmp_path / "part.bin"
    squashfs.pack([src], inplace, offset=offset)
    sif.write_sif(tmp_path / "inplace.sif", inplace, created=1700000000, in_place=True, **objs)
    assert not inplace.exists()  # renamed into the SIF
    assert (tmp_path / "inplace.sif").read_bytes() == (tmp_path / "copied.sif").read_bytes()
    with pytest.raises(UserError, match="no hsqs magic at offset"):
        sif.write_sif(tmp_path / "x.sif", plain, created=0, in_place=True, **objs)
    assert plain.exists()


def test_inherits_an_apptainer_built_base(tmp_path, tiny_plan):
    """A base made by `apptainer build` (.def) keeps its labels, %environment and runscript."""
    sd = tmp_path / "rootfs" / ".singularity.d"
    (sd / "env").mkdir(parents=True)
    (sd / "labels.json").write_text('{"org.label-schema.usage": "/.singularity.d/runscript.help", "site": "cscs"}')
    (sd / "env" / "90-environment.sh").write_text(
        "#!/bin/sh\n# Custom environment shell code should follow\n\nexport SITE=cscs\n"
    )
    (sd / "env" / "91-environment.sh").write_text("#!/bin/sh\n# Custom environment shell code should follow\n\n")
    (sd / "runscript").write_text('#!/bin/sh\n\necho "There is no runscript defined for this container\\n";\n')

    class Base:
        rootfs_dir = tmp_path / "rootfs"

    found = apptainer_files.base_singularity(Base())
    assert found["labels"]["site"] == "cscs"
    assert "export SITE=cscs" in found["90-environment.sh"]
    assert found["91-environment.sh"] == "" and found["runscript"] == ""  # Apptainer's empty placeholders
    contents = metadata.Contents(tiny_plan, [], tiny_plan.roots)
    labels = metadata.make_labels(contents, 0, "", {}, {"site": "cscs", "dedal.env": "spoofed"})
    assert labels["site"] == "cscs" and labels["dedal.env"] == "t"  # ours win over the base's


# ----------------------------------------------------------------------------- bundled PMIx
ESD_CPU_LOCK = Path(__file__).parent / "data" / "esd-cpu.spack.lock"  # a real lock: `dedal fetch spack-envs/esd-cpu`


def test_pmix_version_of_the_header_open_mpi_installs():
    """What Open MPI 5.0.7 (+internal-pmix) installs as include/pmix_version.h (excerpt)."""
    header = (
        "#ifndef PMIx_VERSION_H\n#define PMIx_VERSION_H\n\n/* define PMIx version */\n"
        "#define PMIX_VERSION_MAJOR 5L\n#define PMIX_VERSION_MINOR 0L\n#define PMIX_VERSION_RELEASE 5L\n\n"
        "#define PMIX_NUMERIC_VERSION 0x00050005\n#endif\n"
    )
    assert metadata.pmix_version_of_header(header) == "5.0.5"
    assert metadata.pmix_version_of_header("#define PMIX_VERSION_MAJOR 5L\n") is None
    assert metadata.pmix_version_of_header("") is None


def test_the_pmix_of_an_open_mpi_with_its_own_is_the_bundled_one(mpi_plan):
    """esd-cpu's Open MPI is +internal-pmix and no pmix package stands beside it: the base's
    PMIx (Debian's 5.0.7) is not what its ranks use, the bundled one is; an Open MPI with a
    PMIx package (mpi-cuda-pure) uses that package."""
    lock = load_lock(ESD_CPU_LOCK)
    plan = make_plan(lock, env_name="esd-cpu", install_root=IR, base_image="host", base_id="host:test")
    _r, hashes = asm.select_packages(plan)
    node = metadata.bundled_pmix_node(plan, hashes, lock)
    assert node is not None and node.name == "openmpi" and node.version == "5.0.7"
    _r, hashes = asm.select_packages(mpi_plan)
    assert metadata.bundled_pmix_node(mpi_plan, hashes, load_lock(SPACK_DATA / "mpi-cuda-pure.spack.lock")) is None
    assert "nccl" in metadata.VERSION_COMPONENTS


def test_bundled_pmix_is_read_from_the_open_mpi_layer(tmp_path):
    """The header inside Open MPI's own layer (a real squashfs, laid out as layers are: the
    prefix relative to the install root at the top) gives the label's version."""
    from dedal.adapters import squashfs
    from dedal.stages.layer_audit import LayerInfo
    from dedal.stages.assemble.stage import bundled_pmix

    lock = load_lock(ESD_CPU_LOCK)
    plan = make_plan(lock, env_name="esd-cpu", install_root=IR, base_image="host", base_id="host:test")
    _r, hashes = asm.select_packages(plan)
    ompi = metadata.bundled_pmix_node(plan, hashes, lock)
    top = f"openmpi-5.0.7-{ompi.hash}"
    (tmp_path / top / "include").mkdir(parents=True)
    (tmp_path / top / "include" / "pmix_version.h").write_text(
        "#define PMIX_VERSION_MAJOR 5L\n#define PMIX_VERSION_MINOR 0L\n#define PMIX_VERSION_RELEASE 5L\n"
    )
    layer = tmp_path / "layer.sqfs"
    squashfs.pack([tmp_path / top], layer, keep_as_directory=True)

    class Store:
        def sqfs(self, key):
            return layer

    info = LayerInfo(hash=ompi.hash, key="k", name="openmpi", version="5.0.7", prefix=top, sha256="", size=0)
    assert bundled_pmix(plan, hashes, lock, [info], Store()) == ("5.0.5", "bundled with openmpi@5.0.7")
    assert squashfs.read_text(layer, f"{top}/include/missing.h") is None
    (tmp_path / "empty").mkdir()
    squashfs.pack([tmp_path / "empty"], tmp_path / "other.sqfs", keep_as_directory=True)
    layer = tmp_path / "other.sqfs"  # an Open MPI layer without the header: no label, no error
    assert bundled_pmix(plan, hashes, lock, [info], Store()) is None


def test_current_says_why_an_image_is_assembled_again(tmp_path: Path) -> None:
    from dedal.model.artifacts import sha256_file
    from dedal.stages.assemble.manifest import current

    sif, js, sbom_path = tmp_path / "t.sif", tmp_path / "t.image.json", tmp_path / "t.sbom.cdx.json"
    assert "no readable t.image.json" in current(sif, js, sbom_path, "d")
    sif.write_bytes(b"SIF")
    js.write_text(json.dumps({"inputs": "old", "size": 3, "sha256": sha256_file(sif)}))
    assert "inputs changed" in current(sif, js, sbom_path, "d")
    js.write_text(json.dumps({"inputs": "d", "size": 3, "sha256": sha256_file(sif)}))
    assert "no t.sbom.cdx.json" in current(sif, js, sbom_path, "d")
    sbom_path.write_text("{}")
    assert current(sif, js, sbom_path, "d") is None
    sif.write_bytes(b"SIG")
    assert "differs from its manifest" in current(sif, js, sbom_path, "d")


def test_assembling_on_a_base_as_a_user_who_is_not_root_is_refused_in_one_line(tmp_path) -> None:
    """Measured as such a user: fetch, build and verify ran, assembly ended in an internal
    error (PermissionError, /opt/dedal/env in the base's tree). It is now said first."""
    from dedal.model.base import BaseImage
    from dedal.stages.assemble.stage import check_can_assemble

    base = BaseImage("debian-trixie", "debian-trixie-0", tmp_path, "debian", os_release={}, versions={}, packages={})
    with pytest.raises(UserError, match="assembling an image on base debian-trixie needs root"):
        check_can_assemble(base, euid=1000)
    check_can_assemble(base, euid=0)
    check_can_assemble(None, euid=1000)  # base host: the tree is the image's own, nothing of root's
