"""What the assembler bakes into an image, against golden files: the files of
``/.singularity.d`` (environment scripts, runscript, actions, labels.json, the run-help text
and the self-test, with the environment file's own test) and the SIF's labels object.

Made in-process from fixed inputs: the recorded ``spack env activate --sh`` output of the
tiny environment, a stand-in base with a fixed environment and OS, layers with fixed
digests, a fixed creation time and a fixed dedal version (a release must not rewrite the
golden files). ``DEDAL_UPDATE_GOLDEN=1`` rewrites them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from dedal.model import sif
from dedal.model.plan import make_plan
from dedal.model.spack_lock import load_lock
from dedal.stages import assemble as asm
from dedal.model.image import ENV_TEST
from dedal.stages.assemble import apptainer_files, metadata, usage
from dedal.stages.assemble.envscript import activation_script, base_environment_script
from dedal.stages.layer_audit import LayerInfo
from tests.conftest import SPACK_DATA
from tests.fixtures.golden import GOLDEN_DIR, assert_golden, updating
from tests.stages.assemble.test_units import RECORDED_ACTIVATE, RECORDED_PATH

CREATED = 1700000000


class Base:
    """What the assembler reads of a base: its OS and its environment."""

    os_id = "debian"
    os_release = {"PRETTY_NAME": "Debian GNU/Linux 13 (trixie)"}
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "OMPI_MCA_btl": "^openib",
        "SPACK_ROOT": "/opt/spack",
    }


@pytest.fixture(autouse=True)
def fixed_version(monkeypatch):
    monkeypatch.setattr(metadata, "__version__", "0.0.0+golden")


@pytest.fixture(scope="module")
def plan():
    lock = load_lock(SPACK_DATA / "tiny-dedal.spack.lock")
    return make_plan(
        lock,
        env_name="tiny",
        install_root="/opt/esd/software",
        base_image="debian-trixie",
        base_id="debian-trixie:0123456789ab",
        tag="v1",
    )


def layer_infos(plan, hashes):
    return [
        LayerInfo(
            hash=h,
            key=plan.nodes[h].key,
            name=plan.nodes[h].name,
            version=plan.nodes[h].version,
            prefix=plan.nodes[h].prefix_name,
            sha256=hashlib.sha256(h.encode()).hexdigest(),
            size=4096 * (i + 1),
        )
        for i, h in enumerate(hashes)
        if not plan.nodes[h].external
    ]


def contents_of(plan):
    roots, hashes = asm.select_packages(plan)
    versions, sources = metadata.image_versions(plan, hashes, None)
    return metadata.Contents(
        plan, layer_infos(plan, hashes), roots, build_base=Base(), versions=versions, version_sources=sources
    )


def labels_of(plan):
    return metadata.make_labels(contents_of(plan), CREATED, "the tiny test environment", {"site.team": "hpc"})


def test_singularity_d_matches_the_golden_file(tmp_path: Path, plan) -> None:
    env90 = base_environment_script("", Base.env)
    env91 = activation_script(RECORDED_ACTIVATE, {"PATH": RECORDED_PATH})
    root = tmp_path / "root"
    root.mkdir()
    labels = labels_of(plan)
    apptainer_files.write_apptainer_files(
        root,
        env90=env90,
        env91=env91,
        runscript=asm.runscript_text(""),
        labels=labels,
        help=usage.help_text(contents_of(plan), labels, user_help="Say hello with dedal-app."),
        test=usage.test_script(contents_of(plan), image_library_path=["/opt/view/lib"], env_test=ENV_TEST),
        env_test=apptainer_files.script_text("dedal-app | grep -q ok"),
    )
    sd = root / ".singularity.d"
    parts = []
    for p in sorted([*sd.rglob("*"), root / ENV_TEST.lstrip("/")]):
        rel = p.relative_to(sd) if p.is_relative_to(sd) else Path("/") / p.relative_to(root)
        if p.is_symlink():
            parts.append(f"=== {rel} -> {os.readlink(p)}\n")
        elif p.is_file():
            parts.append(f"=== {rel} ({p.stat().st_mode & 0o777:04o})\n{p.read_text()}")
    assert_golden("singularity.d.txt", "".join(parts))


def test_sif_labels_match_the_golden_file(tmp_path: Path, plan) -> None:
    part = tmp_path / "part.sqfs"
    part.write_bytes(b"hsqs" + bytes(4092))  # the labels object does not depend on the partition
    out = sif.write_sif(
        tmp_path / "tiny.sif",
        part,
        definition="Bootstrap: dedal\n",
        labels=labels_of(plan),
        metadata={},
        arch="amd64",
        created=CREATED,
    )
    found = out.by_type(sif.DATA_LABELS)
    assert len(found) == 1
    assert_golden("sif-labels.json", sif.read_object(tmp_path / "tiny.sif", found[0]).decode())


#: the golden files of what goes into an image (its /.singularity.d, its labels, its SBOM)
IMAGE_GOLDEN = ("singularity.d.txt", "sif-labels.json", "sbom.cdx.json")


def test_what_goes_into_an_image_changes_with_its_format() -> None:
    """An image is kept while its inputs are the same, IMAGE_FORMAT among them (dedal's version
    moves only at releases): a change to the files assembly writes without a new format would
    leave every image made before it in place, as current. ``image-format.txt`` records the
    format beside the digest of those golden files; updating the golden files records a new
    format only."""
    from dedal.stages.assemble.manifest import IMAGE_FORMAT

    digest = hashlib.sha256(b"".join((GOLDEN_DIR / n).read_bytes() for n in IMAGE_GOLDEN)).hexdigest()
    record = GOLDEN_DIR / "image-format.txt"
    fmt, recorded = record.read_text().split()[-2:] if record.is_file() else ("0", "")
    if updating() and int(fmt) != IMAGE_FORMAT:
        record.write_text(
            f"# IMAGE_FORMAT, sha256 of the golden files {', '.join(IMAGE_GOLDEN)}\n{IMAGE_FORMAT} {digest}\n"
        )
        fmt, recorded = str(IMAGE_FORMAT), digest
    assert recorded == digest or int(fmt) != IMAGE_FORMAT, (
        f"the files an image is made of changed ({', '.join(IMAGE_GOLDEN)}) at IMAGE_FORMAT {IMAGE_FORMAT}: "
        "raise it in dedal/stages/assemble/manifest.py, then DEDAL_UPDATE_GOLDEN=1"
    )
    assert int(fmt) == IMAGE_FORMAT, f"{record} records format {fmt}: DEDAL_UPDATE_GOLDEN=1 after raising IMAGE_FORMAT"
