"""Publish, pull, list and inspect against a real docker-registry on 127.0.0.1.

The manifest is read back raw from the registry API and compared field by field with
what `apptainer push oras://` writes (../shared/data/logs/apptainer/ and
../shared/notes/prior-art.md D1), which is what `apptainer pull oras://` checks.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import pytest

from dedal.stages import publish as pub
from dedal.stages.publish import Access
from tests.fixtures.registry import LABELS, sha256_file

pytestmark = pytest.mark.registry

EMPTY = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def _publish(run_dedal, sif, *refs, extra=(), env=None):
    r = run_dedal("publish", str(sif), *refs, "--insecure", "--json", *extra, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_manifest_is_exactly_what_apptainer_pulls(run_dedal, registry, sifs):
    sif = sifs["good"]
    res = _publish(
        run_dedal,
        sif,
        registry.ref("esd/tiny-mpi:v1"),
        registry.ref("esd/tiny-mpi:latest"),
        extra=(
            "--description",
            "tiny MPI test image",
            "--source",
            "git@git.example.org:esd/spack-envs",
            "--revision",
            "0123456789abcdef0123456789abcdef01234567",
        ),
    )

    r = registry.manifest("esd/tiny-mpi", "v1")
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/vnd.oci.image.manifest.v1+json"
    raw = r.content
    digest = "sha256:" + hashlib.sha256(raw).hexdigest()
    assert r.headers["Docker-Content-Digest"] == digest == res["digest"]
    m = json.loads(raw)
    assert m["schemaVersion"] == 2
    assert m["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
    assert m["config"]["mediaType"] == "application/vnd.sylabs.sif.config.v1+json"
    assert m["config"]["digest"] == EMPTY
    assert m["config"]["size"] == 2
    assert len(m["layers"]) == 1
    layer = m["layers"][0]
    assert layer["mediaType"] == "application/vnd.sylabs.sif.layer.v1.sif"
    assert layer["digest"] == sha256_file(sif)
    assert layer["size"] == sif.stat().st_size
    assert layer["annotations"] == {"org.opencontainers.image.title": "tiny-mpi.sif"}
    ann = m["annotations"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", ann["org.opencontainers.image.created"])
    assert ann["org.opencontainers.image.description"] == "tiny MPI test image"
    # provenance read from the SIF's JSON.Labels object
    assert ann["org.dedal.environment"] == LABELS["org.dedal.environment"]
    assert ann["org.dedal.lock-hash"] == LABELS["org.dedal.lock-hash"]
    assert ann["org.dedal.spack-commit"] == LABELS["org.dedal.spack-commit"]
    # OCI: source is a URL (here given), revision the commit of those sources, not Spack's
    assert ann["org.opencontainers.image.source"] == "https://git.example.org/esd/spack-envs"
    assert ann["org.opencontainers.image.revision"] == "0123456789abcdef0123456789abcdef01234567"

    # the config blob is the two bytes {}
    cfg = registry.api("GET", f"/v2/esd/tiny-mpi/blobs/{EMPTY}")
    assert cfg.status_code == 200 and cfg.content == b"{}"
    # the layer blob is the SIF, byte for byte
    blob = registry.api("GET", f"/v2/esd/tiny-mpi/blobs/{layer['digest']}")
    assert blob.content == sif.read_bytes()
    # both tags name the same manifest
    assert registry.manifest("esd/tiny-mpi", "latest").content == raw
    tags = registry.api("GET", "/v2/esd/tiny-mpi/tags/list").json()["tags"]
    assert sorted(tags) == ["latest", "v1"]


def test_round_trip_is_byte_identical(run_dedal, registry, sifs, tmp_path):
    sif = sifs["good"]
    _publish(run_dedal, sif, registry.ref("esd/tiny-mpi:v1"))
    out = tmp_path / "pulled" / "copy.sif"
    out.parent.mkdir()
    r = run_dedal("pull", registry.ref("esd/tiny-mpi:v1"), "-o", str(out), "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert out.read_bytes() == sif.read_bytes()
    assert res["sif_digest"] == sha256_file(sif)
    assert res["layer_media_type"] == pub.SIF_LAYER_MEDIA_TYPE
    assert os.listdir(out.parent) == ["copy.sif"]  # no temporary file left
    assert os.access(out, os.X_OK)

    # an existing file is not replaced without --force; by digest and into a directory work
    again = run_dedal("pull", registry.ref("esd/tiny-mpi:v1"), "-o", str(out), "--insecure")
    assert again.returncode == 2 and "already exists" in again.stderr
    by_digest = registry.ref(f"esd/tiny-mpi@{res['digest']}")
    r = run_dedal("pull", by_digest, "-o", str(out.parent), "--insecure")
    assert r.returncode == 0, r.stderr
    assert (out.parent / "tiny-mpi.sif").read_bytes() == sif.read_bytes()


def test_default_tag_and_registry_setting(run_dedal, registry, sifs, tmp_path):
    """Without a reference the setting `registry` is used, and the tag is the file stem."""
    r = run_dedal(
        "-s",
        f"registry=oras://{registry.host}/esd/defaults",
        "-s",
        "registry_insecure=true",
        "publish",
        str(sifs["good"]),
    )
    assert r.returncode == 0, r.stderr
    assert f"published oras://{registry.host}/esd/defaults:tiny-mpi" in r.stdout
    r = run_dedal(
        "-s", f"registry=oras://{registry.host}/esd/defaults", "-s", "registry_insecure=true", "images", "--json"
    )
    assert r.returncode == 0, r.stderr
    assert [e["tag"] for e in json.loads(r.stdout)] == ["tiny-mpi"]


def test_republish_uploads_no_blob_twice(run_dedal, registry, proxy_for, sifs, reports):
    proxy = proxy_for(registry)
    ref = f"oras://{proxy.host}/esd/tiny-mpi"
    first = _publish(
        run_dedal, sifs["good"], f"{ref}:v1", extra=("--attach", str(reports["dir"]), str(reports["sbom"]))
    )
    uploads_first = proxy.uploads()
    assert sorted(uploads_first) == sorted(first["blobs_uploaded"])
    assert len(uploads_first) == len(set(uploads_first))  # not even within one publish
    assert sha256_file(sifs["good"]) in uploads_first and EMPTY in uploads_first

    second = _publish(
        run_dedal,
        sifs["good"],
        f"{ref}:v1",
        f"{ref}:v1.0.0",
        extra=("--attach", str(reports["dir"]), str(reports["sbom"])),
    )
    assert proxy.uploads() == uploads_first  # the registry saw no further blob upload
    assert second["blobs_uploaded"] == []
    assert set(second["blobs_skipped"]) == set(uploads_first)
    assert second["digest"] == first["digest"]
    assert [a["digest"] for a in second["attachments"]] == [a["digest"] for a in first["attachments"]]
    # the referrers index did not grow either
    index = registry.manifest("esd/tiny-mpi", first["digest"].replace(":", "-")).json()
    assert len(index["manifests"]) == 2

    # another image into the same repository shares the config blob only
    third = _publish(run_dedal, sifs["other"], f"{ref}:other")
    assert third["blobs_uploaded"] == [sha256_file(sifs["other"])]
    assert EMPTY in third["blobs_skipped"]


def test_attachments_with_tag_schema_fallback(run_dedal, registry, sifs, reports):
    ref = registry.ref("esd/tiny-mpi:v1")
    res = _publish(
        run_dedal,
        sifs["good"],
        ref,
        extra=("--attach", str(reports["verify"]), str(reports["report"]), "--attach", str(reports["sbom"])),
    )
    assert res["referrers"] == "tag-schema"  # docker-registry 2.8 has no referrers API
    assert registry.api("GET", f"/v2/esd/tiny-mpi/referrers/{res['digest']}").status_code == 404
    types = {a["artifact_type"]: a for a in res["attachments"]}
    assert set(types) == {"application/vnd.dedal.verify.v1+json", "application/vnd.cyclonedx+json"}
    assert types["application/vnd.dedal.verify.v1+json"]["files"] == ["verify.json", "report.md"]

    # the sha256-<hex> tag holds an OCI index of the referrers (what `oras discover` reads)
    r = registry.manifest("esd/tiny-mpi", res["digest"].replace(":", "-"))
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "application/vnd.oci.image.index.v1+json"
    index = r.json()
    assert {d["artifactType"] for d in index["manifests"]} == set(types)
    verify_desc = next(d for d in index["manifests"] if d["artifactType"] == "application/vnd.dedal.verify.v1+json")
    assert verify_desc["annotations"]["org.dedal.verdict"] == "good"
    for desc in index["manifests"]:
        art = registry.manifest("esd/tiny-mpi", desc["digest"]).json()
        assert art["artifactType"] == desc["artifactType"]
        assert art["subject"] == {
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": res["digest"],
            "size": res["manifest_size"],
        }
        assert art["config"]["mediaType"] == "application/vnd.oci.empty.v1+json"
        for layer in art["layers"]:
            title = layer["annotations"]["org.opencontainers.image.title"]
            source = reports["sbom"] if title.endswith("cdx.json") else reports["dir"] / title
            blob = registry.api("GET", f"/v2/esd/tiny-mpi/blobs/{layer['digest']}")
            assert blob.content == source.read_bytes()
    # the image manifest itself is untouched: still exactly one SIF layer
    assert len(registry.manifest("esd/tiny-mpi", "v1").json()["layers"]) == 1

    info = pub.inspect_remote(ref, access=Access(insecure=True))
    assert info["apptainer_pullable"] and info["problems"] == []
    assert info["referrers"] == "tag-schema"
    assert info["verdict"] == "good"
    files = {f["title"] for a in info["attachments"] for f in a["files"]}
    assert files == {"verify.json", "report.md", "sbom.cdx.json"}


def test_attachments_through_the_referrers_api(run_dedal, registry, proxy_for, sifs, reports):
    """Against a registry with the OCI 1.1 referrers API (emulated by the proxy in front of
    docker-registry: OCI-Subject header + GET /referrers/) no fallback tag is written."""
    proxy = proxy_for(registry, referrers_api=True)
    ref = f"oras://{proxy.host}/esd/tiny-mpi:v1"
    res = _publish(run_dedal, sifs["good"], ref, extra=("--attach", str(reports["dir"]), str(reports["sbom"])))
    assert res["referrers"] == "api"
    assert registry.manifest("esd/tiny-mpi", res["digest"].replace(":", "-")).status_code == 404
    info = pub.inspect_remote(ref, access=Access(insecure=True))
    assert info["referrers"] == "api"
    assert {a["artifactType"] for a in info["attachments"]} == {
        "application/vnd.dedal.verify.v1+json",
        "application/vnd.cyclonedx+json",
    }
    assert info["verdict"] == "good"


def test_images_lists_tags_with_size_created_and_verdict(run_dedal, registry, sifs, reports, tmp_path):
    repo = "esd/tiny-mpi"
    _publish(run_dedal, sifs["good"], registry.ref(f"{repo}:verified"), extra=("--attach", str(reports["dir"])))
    from dedal.stages.verify.report import VerifyReport, write_report

    failing = tmp_path / "failing"
    failing.mkdir()
    write_report(VerifyReport(image="other.sif", verdict="bad"), failing)
    _publish(
        run_dedal,
        sifs["other"],
        registry.ref(f"{repo}:failed"),
        extra=("--attach", str(failing / "verify.json"), "--force"),
    )  # a failed verification needs --force
    _publish(run_dedal, sifs["other"], registry.ref(f"{repo}:plain"))  # same manifest as :failed
    _publish(run_dedal, sifs["wrong_arch"], registry.ref(f"{repo}:unverified"))

    r = run_dedal("images", f"{registry.host}/{repo}", "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    rows = {e["tag"]: e for e in json.loads(r.stdout)}
    assert set(rows) == {"verified", "failed", "plain", "unverified"}  # no sha256-... tags
    assert rows["verified"]["verdict"] == "good"
    assert rows["failed"]["verdict"] == "bad" and rows["plain"]["verdict"] == "bad"
    assert rows["unverified"]["verdict"] == "unverified"
    assert rows["verified"]["size"] == sifs["good"].stat().st_size
    assert rows["unverified"]["arch"] != rows["verified"]["arch"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", e["created"]) for e in rows.values())

    table = run_dedal("images", registry.ref(repo), "--insecure")
    assert table.returncode == 0, table.stderr
    assert "verified" in table.stdout and "good" in table.stdout and "4 image(s)" in table.stdout

    missing = run_dedal("images", registry.ref("esd/nothing-here"), "--insecure")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_publish_refuses_a_failed_verification_unless_forced(run_dedal, registry, sifs, tmp_path):
    """The publish gate (setting verify_gate, default passed: good or suboptimal) reads the verdict of an
    attached verify.json; a refused one uploads nothing and says how to force it."""
    from dedal.stages.verify.report import VerifyReport, write_report

    bad, suboptimal = tmp_path / "bad", tmp_path / "suboptimal"
    write_report(VerifyReport(image="other.sif", verdict="bad"), bad)
    write_report(VerifyReport(image="other.sif", verdict="suboptimal"), suboptimal)
    ref = registry.ref("esd/gate:v1")
    refused = run_dedal("publish", str(sifs["other"]), ref, "--insecure", "--attach", str(bad))
    assert refused.returncode == 2 and "verification verdict bad" in refused.stderr and "--force" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert registry.manifest("esd/gate", "v1").status_code == 404
    strict = run_dedal(
        "publish", str(sifs["other"]), ref, "--insecure", "--attach", str(suboptimal), env={"DEDAL_VERIFY_GATE": "good"}
    )
    assert strict.returncode == 2 and "verify_gate good" in strict.stderr
    assert registry.manifest("esd/gate", "v1").status_code == 404
    _publish(run_dedal, sifs["other"], ref, extra=("--attach", str(suboptimal)))  # passed: published
    forced = _publish(
        run_dedal, sifs["other"], registry.ref("esd/gate:forced"), extra=("--attach", str(bad), "--force")
    )
    assert forced["digest"] and registry.manifest("esd/gate", "forced").status_code == 200


def test_publish_gates_skipped_gpu_checks_as_build_image_does(run_dedal, registry, sifs, tmp_path):
    """A report whose GPU checks were skipped (a GPU image verified without GPU) carries what was skipped in
    its attachment's annotations; the strict gate (verify_gate good) refuses it, naming what was skipped and
    how to publish anyway; the default gate publishes it; an older report without skipped checks passes."""
    from dedal.stages.verify.checks import CheckResult, skipped_check
    from dedal.stages.verify.report import VerifyReport, write_report

    ran = CheckResult("osu_latency", "latency", "us", "good")
    gpu, old = tmp_path / "gpu", tmp_path / "old"
    write_report(
        VerifyReport(
            image="other.sif", checks=[ran, skipped_check("osu_latency D D", "latency", "us", "no GPU", gpu=True)]
        ),
        gpu,
    )
    write_report(VerifyReport(image="other.sif", checks=[ran]), old)
    strict = {"DEDAL_VERIFY_GATE": "good"}
    ref = registry.ref("esd/gpu:v1")
    refused = run_dedal("publish", str(sifs["other"]), ref, "--insecure", "--attach", str(gpu), env=strict)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    for said in (
        "verification verdict good (GPU checks skipped: no GPU)",
        "verify_gate good",
        "--force",
        "verify_gate=passed",
        "verify_gate=off",
    ):
        assert said in refused.stderr, (said, refused.stderr)
    assert registry.manifest("esd/gpu", "v1").status_code == 404

    res = _publish(run_dedal, sifs["other"], ref, extra=("--attach", str(gpu)))  # default gate: passed
    verify = next(a for a in res["attachments"] if a["artifact_type"] == "application/vnd.dedal.verify.v1+json")
    assert verify["annotations"]["org.dedal.verdict"] == "good"
    assert verify["annotations"]["org.dedal.verdict.skipped"] == "GPU checks skipped: no GPU"
    art = registry.manifest("esd/gpu", verify["digest"]).json()
    assert art["annotations"]["org.dedal.verdict.skipped"] == "GPU checks skipped: no GPU"
    shown = run_dedal("inspect", ref, "--insecure")
    assert shown.returncode == 0 and "verdict good (GPU checks skipped: no GPU)" in shown.stdout, shown.stdout

    plain = _publish(run_dedal, sifs["other"], registry.ref("esd/gpu:old"), extra=("--attach", str(old)), env=strict)
    verify = next(a for a in plain["attachments"] if a["artifact_type"] == "application/vnd.dedal.verify.v1+json")
    assert "org.dedal.verdict.skipped" not in verify["annotations"]


def test_inspect_command_for_remote_references(run_dedal, registry, sifs, reports):
    """`dedal inspect oras://...` (the command module is shared with local inspection; it
    reads `registry_insecure` from the settings) lists the attachments."""
    ref = registry.ref("esd/tiny-mpi:v1")
    _publish(run_dedal, sifs["good"], ref, extra=("--attach", str(reports["dir"]), str(reports["sbom"])))
    insecure = {"DEDAL_REGISTRY_INSECURE": "true"}
    r = run_dedal("inspect", ref, "--json", env=insecure)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["sif"]["title"] == "tiny-mpi.sif"
    assert info["apptainer_pullable"] is True
    assert len(info["attachments"]) == 2
    text = run_dedal("inspect", ref, env=insecure)
    assert text.returncode == 0, text.stderr
    assert "verify.json" in text.stdout and "sbom.cdx.json" in text.stdout
    local = run_dedal("inspect", ref, "--json")  # a registry on 127.0.0.1 needs no --insecure (as with Apptainer)
    assert local.returncode == 0 and json.loads(local.stdout)["digest"] == info["digest"]
    # the option exists (for registries elsewhere), and the text is a summary, not a key: json dump
    summary = run_dedal("inspect", ref, "--insecure")
    assert summary.returncode == 0, summary.stderr
    lines = summary.stdout.splitlines()
    assert lines[0] == ref
    assert any(
        ln.split()
        == ["digest", info["digest"], "(application/vnd.oci.image.manifest.v1+json,", f"{info['manifest_size']}", "B)"]
        for ln in lines
    )
    assert any(ln.strip().startswith("SIF") and "tiny-mpi.sif" in ln and info["sif"]["digest"] in ln for ln in lines)
    assert "  apptainer    `apptainer pull oras://...` accepts it" in lines
    assert "  verdict      good" in lines and "  attachments  2 (found through the referrers tag)" in lines
    assert any(
        ln.strip().startswith("application/vnd.dedal.verify.v1+json sha256:") and "verdict good" in ln for ln in lines
    )
    assert "      verify.json (" in summary.stdout and "{" not in summary.stdout


def test_publish_refuses_bad_input_before_any_upload(run_dedal, registry, proxy_for, sifs, tmp_path):
    proxy = proxy_for(registry)
    r = run_dedal("publish", str(sifs["not_sif"]), f"oras://{proxy.host}/esd/x:v1", "--insecure")
    assert r.returncode == 2 and "not a SIF image" in r.stderr
    r = run_dedal("publish", str(tmp_path / "missing.sif"), f"oras://{proxy.host}/esd/x:v1", "--insecure")
    assert r.returncode == 2 and "no such file" in r.stderr
    r = run_dedal(
        "publish",
        str(sifs["good"]),
        f"oras://{proxy.host}/esd/x:v1",
        "--insecure",
        "--attach",
        str(tmp_path / "nope.json"),
    )
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    r = run_dedal("publish", str(sifs["good"]), f"oras://{proxy.host}/Esd/x:v1", "--insecure")
    assert r.returncode == 2 and "lowercase" in r.stderr
    assert proxy.seen == []  # nothing reached the registry


def test_plain_http_to_a_local_registry_without_asking(run_dedal, registry, sifs, tmp_path):
    """As with Apptainer, a registry on 127.0.0.1 that serves plain HTTP needs no --insecure
    (a remote one does: tests/adapters/registry/test_client.py)."""
    r = run_dedal("publish", str(sifs["good"]), registry.ref("esd/tiny-mpi:v1"))
    assert r.returncode == 0, r.stderr
    r = run_dedal("pull", registry.ref("esd/tiny-mpi:v1"), "-o", str(tmp_path / "back.sif"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back.sif").read_bytes() == sifs["good"].read_bytes()


def test_verdict_of_report_shapes():
    assert pub.verdict_of({"verdict": "Suboptimal", "checks": []}) == "suboptimal"
    assert pub.verdict_of({"passed": False}) == "fail"
    assert pub.verdict_of({"ok": True}) == "pass"
    assert pub.verdict_of({"checks": []}) == "unknown"
    assert pub.verdict_of([1, 2]) == "unknown"


def test_uploads_and_downloads_count_their_bytes_on_a_live_display(registry, sifs, tmp_path, monkeypatch):
    """On a terminal (here a rich console forced to be one) each blob's transfer is a byte
    count: the SIF's upload and download reach its size."""
    import io

    from rich.console import Console

    from dedal.ui import progress as pg

    counts: dict = {}
    monkeypatch.setattr(pg.Meter, "advance", lambda self, n: counts.__setitem__(id(self), counts.get(id(self), 0) + n))
    monkeypatch.setattr(pg.Meter, "update", lambda self, done: counts.__setitem__(id(self), done))
    size = sifs["good"].stat().st_size
    with pg.Transfers(live=True, console=Console(file=io.StringIO(), force_terminal=True)):
        pub.publish(sifs["good"], [registry.ref("esd/meter:v1")], access=Access(insecure=True))
        assert size in counts.values()
        counts.clear()
        pulled = pub.pull(registry.ref("esd/meter:v1"), tmp_path / "x.sif", access=Access(insecure=True))
    assert list(counts.values()) == [size] and sha256_file(tmp_path / "x.sif") == pulled.sif_digest


def test_source_and_revision_of_a_ci_job_and_a_refused_source(run_dedal, registry, sifs):
    ci = {
        "CI_PROJECT_URL": "https://gitlab.example.org/esd/spack-envs",
        "CI_COMMIT_SHA": "f" * 40,
        "GITHUB_REPOSITORY": "",
    }
    r = run_dedal("publish", str(sifs["good"]), registry.ref("esd/ci:v1"), "--insecure", "--json", env=ci)
    assert r.returncode == 0, r.stderr
    ann = json.loads(r.stdout)["annotations"]
    assert ann["org.opencontainers.image.source"] == ci["CI_PROJECT_URL"]
    assert ann["org.opencontainers.image.revision"] == "f" * 40
    assert ann["org.dedal.spack-commit"] == LABELS["org.dedal.spack-commit"]
    bad = run_dedal("publish", str(sifs["good"]), registry.ref("esd/ci:v2"), "--insecure", "--source", "demo spack@abc")
    assert bad.returncode == 2 and "--source 'demo spack@abc': expected the URL" in bad.stderr
    assert registry.manifest("esd/ci", "v2").status_code == 404


def test_a_report_directory_is_three_referrers_with_the_logs_in_one_archive(
    run_dedal, registry, sifs, reports, tmp_path
):
    """What CI and build-image attach: the report directory (verify.json, report.md, plots and
    raw logs) and the SBOM: the report, the SBOM and one archive of the logs."""
    import shutil
    import tarfile

    report = tmp_path / "report"
    shutil.copytree(reports["dir"], report)
    (report / "runs").mkdir()
    for i in range(12):
        (report / "runs" / f"osu_latency-{i}.log").write_text(f"# OSU MPI Latency Test run {i}\n")
    (report / "preflight.json").write_text("{}")
    (report / "latency.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    res = _publish(
        run_dedal, sifs["good"], registry.ref("esd/att:v1"), extra=("--attach", str(report), str(reports["sbom"]))
    )
    kinds = sorted(a["artifact_type"] for a in res["attachments"])
    assert kinds == [
        "application/vnd.cyclonedx+json",
        "application/vnd.dedal.logs.v1.tar+gzip",
        "application/vnd.dedal.verify.v1+json",
    ]
    verify = next(a for a in res["attachments"] if a["artifact_type"].startswith("application/vnd.dedal.verify"))
    assert "latency.png" in verify["files"] and "verify.json" in verify["files"]
    logs = next(a for a in res["attachments"] if a["artifact_type"].endswith("tar+gzip"))
    assert logs["files"] == ["report-logs.tar.gz"]
    art = registry.manifest("esd/att", logs["digest"]).json()
    blob = registry.api("GET", f"/v2/esd/att/blobs/{art['layers'][0]['digest']}")
    archive = tmp_path / "logs.tar.gz"
    archive.write_bytes(blob.content)
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == ["preflight.json"] + sorted(f"runs/osu_latency-{i}.log" for i in range(12))
    # published again: the same artifacts, no referrer added
    again = _publish(
        run_dedal, sifs["good"], registry.ref("esd/att:v1"), extra=("--attach", str(report), str(reports["sbom"]))
    )
    assert sorted(a["digest"] for a in again["attachments"]) == sorted(a["digest"] for a in res["attachments"])
    index = registry.manifest("esd/att", res["digest"].replace(":", "-")).json()
    assert len(index["manifests"]) == 3
