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
    apptainer(
        "registry",
        "login",
        "--username",
        USER,
        "--password-stdin",
        f"oras://{auth_registry.host}",
        input=PASSWORD + "\n",
    )
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
    apptainer(
        "key",
        "newpair",
        "--name",
        "dedal test",
        "--email",
        "test@example.org",
        "--comment",
        "test",
        "--password",
        "",
        "--push=false",
    )
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


# ----------------------------------------------------------------------------- dedal signs and requires signatures (issue 39, item 5)

PASSPHRASE = "correct horse battery staple 39"


def _keypair(apptainer, name: str, keysdir=None, password: str = PASSPHRASE) -> str:
    """A PGP key pair in Apptainer's keyring (``keysdir``: another keyring); its fingerprint."""
    extra = ["--keysdir", str(keysdir)] if keysdir else []
    apptainer(
        "key",
        "newpair",
        *extra,
        "--name",
        name,
        "--email",
        "t@example.org",
        "--comment",
        "dedal test",
        "--password",
        password,
        "--bit-length",
        "2048",
        "--push=false",
    )
    listing = apptainer("key", "list", "--secret", *extra).stdout
    return next(line.split()[-1] for line in listing.splitlines() if "Fingerprint:" in line).lower()


def _one_error(r) -> str:
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("dedal: error: "), r.stderr
    return lines[0]


def test_publish_sign_is_accepted_by_apptainer_verify(run_dedal, apptainer, registry, sifs, tmp_path):
    fingerprint = _keypair(apptainer, "dedal signer")
    ref = registry.ref("esd/signed:v1")
    before = sha256_file(sifs["good"])
    r = run_dedal("publish", str(sifs["good"]), ref, "--sign", "--json", env={"DEDAL_SIGN_PASSPHRASE": PASSPHRASE})
    assert r.returncode == 0, r.stderr
    result = __import__("json").loads(r.stdout)
    assert result["signed_by"]["fingerprints"] == [fingerprint] and result["sif"] == str(sifs["good"])
    assert sha256_file(sifs["good"]) == before, "the image itself is left as it is: a signed copy is pushed"
    assert PASSPHRASE not in r.stdout + r.stderr
    # Apptainer pulls it and accepts its signature
    apptainer("pull", str(tmp_path / "by-apptainer.sif"), ref)
    v = apptainer("verify", str(tmp_path / "by-apptainer.sif"))
    assert "Verified signature" in v.stdout + v.stderr and fingerprint.upper() in v.stdout.upper()
    # and so does dedal, requiring it
    r = run_dedal("pull", ref, "-o", str(tmp_path / "by-dedal.sif"), "--verify", "--json")
    assert r.returncode == 0, r.stderr
    assert __import__("json").loads(r.stdout)["signed_by"]["fingerprints"] == [fingerprint]
    assert sha256_file(tmp_path / "by-dedal.sif") == sha256_file(tmp_path / "by-apptainer.sif")
    # the passphrase is in no file dedal or Apptainer wrote (logs, caches, results)
    for path in tmp_path.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < (8 << 20):
            assert PASSPHRASE.encode() not in path.read_bytes(), path


def test_pull_verify_refuses_unsigned_and_wrongly_signed_images(run_dedal, apptainer, registry, sifs, tmp_path):
    mine = _keypair(apptainer, "trusted signer")
    stranger = tmp_path / "stranger-keys"
    _keypair(apptainer, "stranger", keysdir=stranger)
    unsigned = registry.ref("esd/x:unsigned")
    assert run_dedal("publish", str(sifs["good"]), unsigned).returncode == 0
    out = tmp_path / "out.sif"
    line = _one_error(run_dedal("pull", unsigned, "-o", str(out), "--verify"))
    assert "the image is not signed" in line and unsigned in line
    assert not out.exists() and not list(tmp_path.glob(".out.sif.tmp~*"))
    line = _one_error(run_dedal("-s", "require_signature=true", "pull", unsigned, "-o", str(out)))
    assert "not signed" in line and not out.exists()
    assert run_dedal("pull", unsigned, "-o", str(out)).returncode == 0  # not required: pulled
    out.unlink()

    # signed by a key this keyring does not hold
    wrong = registry.ref("esd/x:stranger")
    r = run_dedal(
        "publish",
        str(sifs["good"]),
        wrong,
        "--sign",
        env={"DEDAL_SIGN_PASSPHRASE": PASSPHRASE, "APPTAINER_KEYSDIR": str(stranger)},
    )
    assert r.returncode == 0, r.stderr
    line = _one_error(run_dedal("pull", wrong, "-o", str(out), "--verify"))
    assert "signature is not accepted" in line and "unknown entity" in line and not out.exists()

    # signed by a key of the keyring, but not one the setting `signers` names
    good = registry.ref("esd/x:mine")
    assert (
        run_dedal("publish", str(sifs["good"]), good, "--sign", env={"DEDAL_SIGN_PASSPHRASE": PASSPHRASE}).returncode
        == 0
    )
    line = _one_error(run_dedal("-s", "signers=['" + "f" * 40 + "']", "pull", good, "-o", str(out), "--verify"))
    assert f"signed by {mine}, not by a key of the setting `signers`" in line and not out.exists()
    assert run_dedal("-s", f"signers=['{mine}']", "pull", good, "-o", str(out), "--verify").returncode == 0


def test_publish_sign_with_a_wrong_passphrase_sends_nothing(run_dedal, apptainer, registry, sifs):
    _keypair(apptainer, "dedal signer")
    ref = registry.ref("esd/nothing:v1")
    r = run_dedal("publish", str(sifs["good"]), ref, "--sign", env={"DEDAL_SIGN_PASSPHRASE": "not it"})
    line = _one_error(r)
    assert "apptainer sign --keyidx 0 failed" in line and "passphrase" in line and "not it" not in line
    assert registry.api("GET", "/v2/esd/nothing/tags/list").status_code == 404


def test_provenance_statement_is_attached_and_read_by_inspect(run_dedal, apptainer, registry, tmp_path):
    """--provenance: an in-toto statement of the build's inputs (from the image's labels)
    about the SIF pushed (here the signed copy) hangs off the image as a referrer."""
    import json

    from tests.fixtures.registry import make_sif

    labels = {
        "dedal.env": "tiny",
        "dedal.tag": "v1",
        "dedal.lock.sha256": "ab" * 32,
        "dedal.spack.commit": "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384",
        "dedal.base.image": "debian-trixie",
        "dedal.base.id": "debian-trixie-0123456789abcdef",
        "dedal.base.sha256": "cd" * 32,
        "dedal.source_date_epoch": "1700000000",
        "dedal.version": "0.1",
    }
    image = make_sif(
        tmp_path / "tiny.sif",
        arch=__import__("dedal.model.sif", fromlist=["x"]).host_arch(),
        payload=b"p" * 4096,
        labels=labels,
    )
    _keypair(apptainer, "dedal signer")
    ref = registry.ref("esd/prov:v1")
    r = run_dedal(
        "publish", str(image), ref, "--sign", "--provenance", "--json", env={"DEDAL_SIGN_PASSPHRASE": PASSPHRASE}
    )
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)
    [att] = [a for a in pushed["attachments"] if a["artifact_type"] == "application/vnd.in-toto+json"]
    assert att["files"] == ["provenance.intoto.json"]
    info = json.loads(run_dedal("inspect", ref, "--json").stdout)
    prov = info["provenance"]
    assert prov["predicateType"] == "https://slsa.dev/provenance/v1"
    assert prov["subject"] == [{"name": "tiny.sif", "digest": {"sha256": pushed["sif_digest"].split(":")[1]}}]
    assert prov["env"] == "tiny" and prov["tag"] == "v1" and prov["source_date_epoch"] == "1700000000"
    assert prov["spack.lock"] == "sha256:" + "ab" * 32 and prov["base:debian-trixie"] == "sha256:" + "cd" * 32
    assert prov["spack"] == "gitCommit:e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384"
    text = run_dedal("inspect", ref).stdout
    assert "provenance   https://slsa.dev/provenance/v1" in text and "spack.lock: sha256:abab" in text
