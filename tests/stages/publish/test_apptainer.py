"""dedal and the real Apptainer on the same local registry: what one publishes the other
pulls byte for byte, Apptainer's registry login serves dedal, signatures survive the trip.
Skipped where apptainer is not on PATH."""
from __future__ import annotations

import pytest

from tests.fixtures.registry import PASSWORD, USER, sha256_file

pytestmark = [pytest.mark.apptainer, pytest.mark.registry]


def test_apptainer_pulls_what_dedal_published(run_dedal, apptainer, registry, sifs, reports, tmp_path):
    """No --insecure on either side: both reach a registry on 127.0.0.1 over plain HTTP."""
    ref = registry.ref("esd/interop:v1")
    r = run_dedal("publish", str(sifs["good"]), ref, "--attach", str(reports["dir"]))
    assert r.returncode == 0, r.stderr
    apptainer("pull", str(tmp_path / "by-apptainer.sif"), ref)
    assert sha256_file(tmp_path / "by-apptainer.sif") == sha256_file(sifs["good"])
    # registry 2.8 has no referrers API: the attachments hang off the referrers-schema tag
    # sha256-<hex>, an index, not an image; dedal lists no such tag, and pulling it says why
    fallback = [t for t in registry.api("GET", "/v2/esd/interop/tags/list").json()["tags"] if t.startswith("sha256-")]
    assert len(fallback) == 1
    tags = run_dedal("images", f"oras://{registry.host}/esd/interop", "--json")
    assert tags.returncode == 0, tags.stderr
    assert "sha256-" not in tags.stdout and '"v1"' in tags.stdout
    r = run_dedal("pull", registry.ref(f"esd/interop:{fallback[0]}"), "-o", str(tmp_path / "x.sif"))
    assert r.returncode != 0 and "referrers" in r.stderr and not (tmp_path / "x.sif").exists()


def test_dedal_pulls_what_apptainer_pushed(run_dedal, apptainer, registry, sifs, tmp_path):
    ref = registry.ref("esd/interop:pushed")
    apptainer("push", str(sifs["good"]), ref)
    out = tmp_path / "by-dedal.sif"
    r = run_dedal("pull", ref, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == sifs["good"].read_bytes()
    r = run_dedal("inspect", ref, "--json")
    assert r.returncode == 0, r.stderr


def test_apptainer_registry_login_serves_dedal(run_dedal, apptainer, auth_registry, sifs, tmp_path):
    """Credentials stored by `apptainer registry login` (~/.apptainer/docker-config.json)."""
    ref = auth_registry.ref("esd/private:v1")
    r = run_dedal("publish", str(sifs["good"]), ref)
    assert r.returncode == 1 and "requires authentication" in r.stderr
    apptainer("registry", "login", "--username", USER, "--password-stdin", f"oras://{auth_registry.host}",
              input=PASSWORD + "\n")
    r = run_dedal("publish", str(sifs["good"]), ref)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "back.sif"
    assert run_dedal("pull", ref, "-o", str(out)).returncode == 0
    assert out.read_bytes() == sifs["good"].read_bytes()
    apptainer("pull", str(tmp_path / "app.sif"), ref)
    assert sha256_file(tmp_path / "app.sif") == sha256_file(sifs["good"])


def test_signature_survives_publish_and_pull(run_dedal, apptainer, registry, sifs, tmp_path):
    """A SIF signed with Apptainer's keyring, published and pulled by dedal, still verifies."""
    signed = tmp_path / "signed.sif"
    signed.write_bytes(sifs["good"].read_bytes())
    apptainer("key", "newpair", "--name", "dedal test", "--email", "test@example.org", "--comment", "test",
              "--password", "", "--push=false")
    apptainer("sign", str(signed))
    apptainer("verify", str(signed))
    ref = registry.ref("esd/signed:v1")
    assert run_dedal("publish", str(signed), ref).returncode == 0
    out = tmp_path / "pulled.sif"
    assert run_dedal("pull", ref, "-o", str(out)).returncode == 0
    assert out.read_bytes() == signed.read_bytes()
    r = apptainer("verify", str(out))
    assert "Verified signature" in r.stdout + r.stderr
    r = apptainer("verify", str(sifs["good"]), check=False)  # the unsigned original does not verify
    assert r.returncode != 0
