"""Failures on the wire and in the registry: retries, tampered blobs, images that
`apptainer pull` would refuse. A pull that is refused leaves no file behind."""

from __future__ import annotations

import hashlib
import json

import pytest

from dedal.stages import publish as pub
from dedal.stages.publish import Access
from dedal.model.sif import host_arch
from tests.fixtures.registry import sha256_file

pytestmark = pytest.mark.registry

EMPTY = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


def _push_raw(registry, repo: str, tag: str, blob: bytes, layers: list) -> str:
    """Push a manifest by hand (raw registry API) to build images dedal would not write."""
    for data in (b"{}", blob):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        loc = registry.api("POST", f"/v2/{repo}/blobs/uploads/").headers["Location"]
        sep = "&" if "?" in loc else "?"
        r = registry.api(
            "PUT",
            f"{loc.split(registry.host, 1)[1]}{sep}digest={digest}",
            data=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        assert r.status_code == 201, r.text
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.sylabs.sif.config.v1+json", "digest": EMPTY, "size": 2},
        "layers": layers,
    }
    raw = json.dumps(manifest).encode()
    r = registry.api(
        "PUT",
        f"/v2/{repo}/manifests/{tag}",
        data=raw,
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    )
    assert r.status_code == 201, r.text
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def _layer(blob: bytes, media_type: str, title: str = "image.sif") -> dict:
    return {
        "mediaType": media_type,
        "digest": "sha256:" + hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        "annotations": {"org.opencontainers.image.title": title},
    }


def test_interrupted_upload_and_5xx_are_retried(run_dedal, registry, proxy_for, sifs, tmp_path):
    proxy = proxy_for(registry)
    sif_digest = sha256_file(sifs["good"])
    proxy.fault("PUT", f"digest={sif_digest}", "drop")  # connection broken half way through the SIF
    proxy.fault("POST", "/blobs/uploads/", 503)  # then the new upload session fails once
    proxy.fault("PUT", "/manifests/v1", 502)  # and the manifest PUT once
    ref = f"oras://{proxy.host}/esd/tiny-mpi:v1"
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["retries"] >= 3
    assert proxy.count("PUT", f"digest={sif_digest}", status=0) == 1  # the broken attempt
    assert proxy.count("PUT", f"digest={sif_digest}", status=201) == 1  # the retried upload
    assert proxy.count("PUT", "/manifests/v1", status=502) == 1
    assert proxy.count("PUT", "/manifests/v1", status=201) == 1
    assert "retry" in r.stderr
    # what landed in the registry is whole
    assert registry.blob_file(sif_digest).read_bytes() == sifs["good"].read_bytes()

    # a download broken off half way is restarted, and the result is still verified
    proxy.fault("GET", f"/blobs/{sif_digest}", "drop")
    out = tmp_path / "pulled.sif"
    r = run_dedal("pull", ref, "-o", str(out), "--insecure")
    assert r.returncode == 0, r.stderr
    assert proxy.count("GET", f"/blobs/{sif_digest}", status=0) == 1
    assert out.read_bytes() == sifs["good"].read_bytes()


def test_persistent_5xx_fails_clearly(registry, proxy_for, sifs):
    proxy = proxy_for(registry)
    proxy.fault("PUT", "/manifests/", 503, times=100)
    with pytest.raises(pub.RegistryError, match=r"PUT http://127\.0\.0\.1:\d+/v2/esd/x/manifests/v1: HTTP 503"):
        pub.publish(
            sifs["good"], [f"oras://{proxy.host}/esd/x:v1"], access=Access(insecure=True, retries=2, backoff=0.01)
        )
    assert proxy.count("PUT", "/manifests/v1") == 3  # one try and two retries


def test_tampered_blob_is_refused_and_leaves_no_file(run_dedal, registry, sifs, tmp_path):
    ref = registry.ref("esd/tiny-mpi:v1")
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure")
    assert r.returncode == 0, r.stderr
    blob = registry.blob_file(sha256_file(sifs["good"]))
    data = bytearray(blob.read_bytes())
    data[-100] ^= 0xFF  # same size, other bytes (inside the squashfs partition)
    blob.write_bytes(bytes(data))

    out = tmp_path / "out" / "tiny.sif"
    out.parent.mkdir()
    r = run_dedal("pull", ref, "-o", str(out), "--insecure")
    assert r.returncode == 1
    assert "sha256 mismatch" in r.stderr and "refusing" in r.stderr
    assert list(out.parent.iterdir()) == []  # no output, no temporary file

    blob.write_bytes(bytes(data) + b"more")  # longer as well (the registry may cut it at the known size)
    r = run_dedal("pull", ref, "-o", str(out), "--insecure")
    assert r.returncode == 1 and "refusing the download" in r.stderr
    assert list(out.parent.iterdir()) == []


def test_pull_refuses_what_apptainer_refuses(run_dedal, registry, sifs, tmp_path):
    sif = sifs["good"].read_bytes()
    _push_raw(
        registry,
        "esd/bad",
        "two-layers",
        sif,
        [_layer(sif, pub.SIF_LAYER_MEDIA_TYPE), _layer(b"{}", pub.SIF_LAYER_MEDIA_TYPE, "x.sif")],
    )
    _push_raw(registry, "esd/bad", "tar-layer", sif, [_layer(sif, "application/vnd.oci.image.layer.v1.tar")])
    junk = sifs["not_sif"].read_bytes()
    _push_raw(registry, "esd/bad", "not-a-sif", junk, [_layer(junk, pub.SIF_LAYER_MEDIA_TYPE)])
    out = tmp_path / "out"
    out.mkdir()
    for tag, message in (
        ("two-layers", "ORAS SIF image should have a single layer, found 2"),
        ("tar-layer", "invalid layer mediatype: application/vnd.oci.image.layer.v1.tar"),
        ("not-a-sif", "not a usable SIF image"),
    ):
        r = run_dedal("pull", registry.ref(f"esd/bad:{tag}"), "-o", str(out / "x.sif"), "--insecure")
        assert r.returncode == 1, (tag, r.stdout)
        assert message in r.stderr, (tag, r.stderr)
        assert "Traceback" not in r.stderr
    assert list(out.iterdir()) == []


def test_wrong_architecture_is_refused_unless_asked(run_dedal, registry, sifs, tmp_path):
    ref = registry.ref("esd/foreign:v1")
    r = run_dedal("publish", str(sifs["wrong_arch"]), ref, "--insecure")
    assert r.returncode == 0, r.stderr  # publishing for another architecture is fine
    out = tmp_path / "foreign.sif"
    r = run_dedal("pull", ref, "-o", str(out), "--insecure")
    assert r.returncode == 2
    assert f"this host is {host_arch()}" in r.stderr
    assert not out.exists() and list(tmp_path.glob(".foreign.sif*")) == []
    other = "arm64" if host_arch() != "arm64" else "amd64"
    r = run_dedal("pull", ref, "-o", str(out), "--insecure", "--arch", other)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == sifs["wrong_arch"].read_bytes()


def test_legacy_layer_media_type_is_accepted(registry, sifs, tmp_path):
    sif = sifs["good"].read_bytes()
    _push_raw(registry, "esd/old", "v0", sif, [_layer(sif, "appliciation/vnd.sylabs.sif.layer.tar", "old.sif")])
    res = pub.pull(registry.ref("esd/old:v0"), tmp_path / "old.sif", access=Access(insecure=True))
    assert res.layer_media_type == "appliciation/vnd.sylabs.sif.layer.tar"
    assert (tmp_path / "old.sif").read_bytes() == sif
    info = pub.inspect_remote(registry.ref("esd/old:v0"), access=Access(insecure=True))
    assert info["apptainer_pullable"] is True
    assert any("legacy layer media type" in p for p in info["problems"])


def test_image_index_resolved_by_architecture(registry, sifs, tmp_path):
    sif = sifs["good"].read_bytes()
    digest = _push_raw(registry, "esd/multi", "amd", sif, [_layer(sif, pub.SIF_LAYER_MEDIA_TYPE)])
    size = len(registry.manifest("esd/multi", "amd").content)
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": digest,
                "size": size,
                "platform": {"os": "linux", "architecture": host_arch()},
            }
        ],
    }
    r = registry.api(
        "PUT",
        "/v2/esd/multi/manifests/multi",
        data=json.dumps(index).encode(),
        headers={"Content-Type": "application/vnd.oci.image.index.v1+json"},
    )
    assert r.status_code == 201, r.text
    res = pub.pull(registry.ref("esd/multi:multi"), tmp_path / "m.sif", access=Access(insecure=True))
    assert res.digest == digest
    with pytest.raises(pub.RegistryError, match="no manifest for linux/riscv64"):
        pub.pull(registry.ref("esd/multi:multi"), tmp_path / "n.sif", access=Access(insecure=True), arch="riscv64")
    assert not (tmp_path / "n.sif").exists()


def test_missing_tag_and_repository(run_dedal, registry, sifs, tmp_path):
    run_dedal("publish", str(sifs["good"]), registry.ref("esd/tiny-mpi:v1"), "--insecure")
    r = run_dedal("pull", registry.ref("esd/tiny-mpi:nope"), "-o", str(tmp_path / "x.sif"), "--insecure")
    assert r.returncode == 1 and "HTTP 404" in r.stderr and "MANIFEST_UNKNOWN" in r.stderr
    assert not (tmp_path / "x.sif").exists()


def test_referrers_tag_is_not_pulled(run_dedal, tmp_path):
    """sha256-<hex> tags list an image's attachments (referrers tag schema): refused with the
    reason before anything is asked of the registry (port 9 is closed)."""
    hexd = "ab" * 32
    r = run_dedal("pull", f"oras://127.0.0.1:9/esd/x:sha256-{hexd}", "-o", str(tmp_path / "x.sif"))
    assert r.returncode == 2 and f"@sha256:{hexd} instead" in r.stderr and "referrers" in r.stderr
    assert list(tmp_path.glob("*.sif")) == []


# ----------------------------------------------------------------------------- bounds of an operation
# (issue 22, point 7): a stalled registry, a persistent 5xx and a long Retry-After end the
# operation within its deadline and retry budget, with one warning per kind of failure.


def _recorder():
    slept = []
    return slept, slept.append


@pytest.mark.reliability
def test_a_registry_that_stops_answering_ends_at_the_deadline(registry, proxy_for, sifs):
    proxy = proxy_for(registry)
    proxy.fault("HEAD", "/blobs/", "hang", times=1000)  # answers /v2/, then nothing more
    with pytest.raises(pub.RegistryError, match=r"deadline of 3 s"):
        pub.publish(
            sifs["good"],
            [f"oras://{proxy.host}/esd/x:v1"],
            access=Access(insecure=True, timeout=1, deadline=3, backoff=0.01),
        )
    stalled = proxy.count("HEAD", "/blobs/", status=0)
    assert 1 <= stalled <= 3, "each attempt waits at most the stall timeout, and none starts after the deadline"


@pytest.mark.reliability
def test_persistent_5xx_is_bounded_for_the_whole_operation(registry, proxy_for, sifs, caplog):
    """Retries of an upload session nest in retries of the upload: without a budget for
    the whole client that was 5 x 5 requests and as many warning lines."""
    proxy = proxy_for(registry)
    proxy.fault("POST", "/blobs/uploads/", 500, times=1000)
    slept, sleep = _recorder()
    caplog.set_level("DEBUG", logger="dedal.registry")
    with pytest.raises(pub.RegistryError, match="gave up after 8 retries"):
        pub.publish(
            sifs["good"],
            [f"oras://{proxy.host}/esd/x:v1"],
            access=Access(insecure=True, retries=4, backoff=0.5, sleep=sleep),
        )
    assert proxy.count("POST", "/blobs/uploads/") <= 9
    warnings = [r for r in caplog.records if r.name == "dedal.registry" and r.levelname == "WARNING"]
    kinds = {("HTTP 500" in r.getMessage(), "upload of" in r.getMessage()) for r in warnings}
    assert len(warnings) == len(kinds) <= 2, [r.getMessage() for r in warnings]
    assert len(slept) == 8 and all(0 < d <= 30 for d in slept)
    assert len(set(slept)) > 1, "backoff grows, with jitter"


@pytest.mark.reliability
def test_a_long_retry_after_ends_the_operation_at_once(registry, proxy_for, sifs):
    proxy = proxy_for(registry)
    proxy.fault("PUT", "/manifests/", (503, {"Retry-After": "3600"}), times=1000)
    slept, sleep = _recorder()
    with pytest.raises(pub.RegistryError, match=r"asks to retry after 3600 s \(Retry-After\); giving up now"):
        pub.publish(
            sifs["good"],
            [f"oras://{proxy.host}/esd/x:v1"],
            access=Access(insecure=True, backoff=0.01, sleep=sleep),
        )
    assert proxy.count("PUT", "/manifests/") == 1 and slept == []


@pytest.mark.reliability
def test_a_short_retry_after_is_honoured(registry, proxy_for, sifs):
    proxy = proxy_for(registry)
    proxy.fault("PUT", "/manifests/v1", (503, {"Retry-After": "7"}))
    slept, sleep = _recorder()
    res = pub.publish(
        sifs["good"], [f"oras://{proxy.host}/esd/x:v1"], access=Access(insecure=True, backoff=0.01, sleep=sleep)
    )
    assert res.references and slept == [7.0]
    assert proxy.count("PUT", "/manifests/v1", status=201) == 1


@pytest.mark.reliability
def test_a_connection_reset_mid_blob_is_retried(registry, proxy_for, sifs, tmp_path):
    proxy = proxy_for(registry)
    sif_digest = sha256_file(sifs["good"])
    proxy.fault("PUT", f"digest={sif_digest}", "reset")
    ref = f"oras://{proxy.host}/esd/x:v1"
    pub.publish(sifs["good"], [ref], access=Access(insecure=True, backoff=0.01))
    assert proxy.count("PUT", f"digest={sif_digest}", status=0) == 1
    assert registry.blob_file(sif_digest).read_bytes() == sifs["good"].read_bytes()
    proxy.fault("GET", f"/blobs/{sif_digest}", "reset")
    pub.pull(ref, tmp_path / "x.sif", access=Access(insecure=True, backoff=0.01))
    assert proxy.count("GET", f"/blobs/{sif_digest}", status=0) == 1
    assert (tmp_path / "x.sif").read_bytes() == sifs["good"].read_bytes()


# ----------------------------------------------------------------------------- a stalled upload (issue 39, item 4)


@pytest.mark.reliability
def test_a_stalled_upload_is_shown_while_it_waits_and_ends_at_the_deadline(registry, proxy_for, sifs, capsys):
    """The registry takes the blob and never answers: attempts x timeout (here 11 x 8 s)
    no longer bounds it, the deadline without progress does; the HEAD and POST answers
    between attempts move nothing and do not start it again. While it waits, a line says
    so, with the seconds left. (The line comes from a once-a-second tick after 5 s without
    a byte; a 6 s attempt left it a window of one second, which a busy machine's tick
    missed about once in 13 runs of the reliability set: 8 s leave three.)"""
    proxy = proxy_for(registry)
    proxy.fault("PUT", "/blobs/uploads/", "hang", times=1000)
    with pytest.raises(
        pub.RegistryError,
        match=r"gave up: no progress within the registry operation's deadline "
        r"of 12 s \(setting registry_deadline_s",
    ):
        pub.publish(
            sifs["good"],
            [f"oras://{proxy.host}/esd/x:v1"],
            access=Access(insecure=True, timeout=8, deadline=12, retries=10, backoff=0.01),
        )
    assert proxy.count("PUT", "/blobs/uploads/") == 2  # 8 s, then the 4 s left
    err = capsys.readouterr().err
    shown = [line for line in err.splitlines() if line.startswith(f"upload to {proxy.host} stalled")]
    assert shown and "bytes sent, no answer for" in shown[0] and "; gives up in " in shown[0], err
    assert "PUT http://" in shown[0] and "/blobs/uploads/" in shown[0]
