"""Credentials and authentication: htpasswd (Basic) and bearer-token registries, every
credential source, clear errors, and no secret in any output, log, error or repr."""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
from pathlib import Path

import pytest

from dedal.stages import publish as pub
from dedal.stages.publish import Access
from dedal.adapters import registry as reg
from dedal.errors import UserError
from tests.fixtures.registry import PASSWORD, USER

pytestmark = pytest.mark.registry

B64 = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


def _docker_config(path: Path, host: str, user: str = USER, password: str = PASSWORD, key_form: str = "{host}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    path.write_text(json.dumps({"auths": {key_form.format(host=host): {"auth": auth}}}))
    return path


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert PASSWORD not in text
        assert B64 not in text


# --------------------------------------------------------------------------- htpasswd


def test_htpasswd_registry_needs_and_checks_credentials(run_dedal, auth_registry, sifs, tmp_path):
    ref = auth_registry.ref("esd/tiny-mpi:v1")
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure")
    assert r.returncode == 1
    assert f"registry {auth_registry.host} requires authentication; no credentials were found" in r.stderr

    wrong = {"DEDAL_REGISTRY_USER": USER, "DEDAL_REGISTRY_PASSWORD": "not-the-password"}
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure", env=wrong)
    assert r.returncode == 1
    assert f"refused the credentials of user '{USER}'" in r.stderr and "wrong user name or password" in r.stderr
    assert "not-the-password" not in r.stderr + r.stdout
    assert "Traceback" not in r.stderr

    right = {"DEDAL_REGISTRY_USER": USER, "DEDAL_REGISTRY_PASSWORD": PASSWORD}
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure", "--json", env=right)
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr)
    manifest = auth_registry.manifest("esd/tiny-mpi", "v1")
    assert manifest.status_code == 200
    _no_secret(manifest.text)

    out = tmp_path / "p.sif"
    r = run_dedal("pull", ref, "-o", str(out), "--insecure", env=right)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == sifs["good"].read_bytes()
    _no_secret(r.stdout, r.stderr)


def test_credentials_from_docker_and_podman_files_and_stdin(run_dedal, auth_registry, isolated_env, sifs, tmp_path):
    ref = auth_registry.ref("esd/tiny-mpi:v1")
    # ~/.docker/config.json (HOME is tmp_path/home in the isolated environment)
    _docker_config(
        Path(isolated_env["HOME"]) / ".docker" / "config.json", auth_registry.host, key_form="https://{host}/v1/"
    )
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure")
    assert r.returncode == 0, r.stderr
    os.remove(Path(isolated_env["HOME"]) / ".docker" / "config.json")

    # $REGISTRY_AUTH_FILE (podman/skopeo format, repository-scoped key) wins over a wrong docker config
    _docker_config(Path(isolated_env["HOME"]) / ".docker" / "config.json", auth_registry.host, password="stale")
    authfile = _docker_config(tmp_path / "auth.json", auth_registry.host, key_form="{host}/esd/tiny-mpi")
    r = run_dedal("pull", ref, "-o", str(tmp_path / "a.sif"), "--insecure", env={"REGISTRY_AUTH_FILE": str(authfile)})
    assert r.returncode == 0, r.stderr
    r = run_dedal("pull", ref, "-o", str(tmp_path / "b.sif"), "--insecure")
    assert r.returncode == 1 and "refused the credentials" in r.stderr  # the stale docker entry alone

    # --password-stdin with --username (overrides the files)
    r = run_dedal(
        "images",
        auth_registry.ref("esd/tiny-mpi"),
        "--insecure",
        "--username",
        USER,
        "--password-stdin",
        "--json",
        input=PASSWORD + "\n",
    )
    assert r.returncode == 0, r.stderr
    assert [e["tag"] for e in json.loads(r.stdout)] == ["v1"]
    r = run_dedal("images", auth_registry.ref("esd/tiny-mpi"), "--insecure", "--password-stdin", input=PASSWORD)
    assert r.returncode == 2 and "no user name" in r.stderr


def test_resolve_credentials_sources_and_precedence(tmp_path, monkeypatch):
    host = "reg.example.org:5000"
    env = {"HOME": str(tmp_path / "home")}
    assert reg.resolve_credentials(host, "esd/x", environ=env) is None
    _docker_config(tmp_path / "home" / ".docker" / "config.json", host, user="docker-user")
    assert reg.resolve_credentials(host, "esd/x", environ=env).username == "docker-user"
    _docker_config(tmp_path / "podman" / "containers" / "auth.json", host, user="podman-user")
    env["XDG_RUNTIME_DIR"] = str(tmp_path / "podman")
    assert reg.resolve_credentials(host, "esd/x", environ=env).username == "podman-user"
    env["REGISTRY_AUTH_FILE"] = str(_docker_config(tmp_path / "a.json", host, user="authfile-user"))
    assert reg.resolve_credentials(host, "esd/x", environ=env).username == "authfile-user"
    env.update(DEDAL_REGISTRY_USER="env-user", DEDAL_REGISTRY_PASSWORD="env-pw")
    assert reg.resolve_credentials(host, "esd/x", environ=env).username == "env-user"
    c = reg.resolve_credentials(host, "esd/x", username="cli-user", password="cli-pw", environ=env)
    assert (c.username, c.password) == ("cli-user", "cli-pw")
    _no_secret(repr(c), str(c))
    assert "cli-pw" not in repr(c)

    with pytest.raises(UserError, match="DEDAL_REGISTRY_USER is not"):
        reg.resolve_credentials(host, environ={"DEDAL_REGISTRY_PASSWORD": "x"})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(UserError, match="not valid JSON"):
        reg.resolve_credentials(host, environ={"REGISTRY_AUTH_FILE": str(tmp_path / "bad.json")})
    (tmp_path / "bad64.json").write_text(json.dumps({"auths": {host: {"auth": "bm9jb2xvbg=="}}}))  # "nocolon"
    with pytest.raises(UserError, match="not base64 of user:password") as info:
        reg.resolve_credentials(host, environ={"REGISTRY_AUTH_FILE": str(tmp_path / "bad64.json")})
    assert "nocolon" not in str(info.value)


def test_docker_credential_helper(tmp_path, monkeypatch):
    """credHelpers are asked through the process adapter, as docker does."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    helper = bindir / "docker-credential-dedaltest"
    helper.write_text(
        '#!/bin/sh\nread host\n[ "$1" = get ] || exit 3\n'
        'printf \'{"ServerURL":"%s","Username":"helper-user","Secret":"helper-secret"}\' "$host"\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"auths": {}, "credHelpers": {"reg.example.org": "dedaltest"}}))
    c = reg.resolve_credentials("reg.example.org", environ={"REGISTRY_AUTH_FILE": str(cfg), "HOME": str(tmp_path)})
    assert (c.username, c.password) == ("helper-user", "helper-secret")
    assert "helper-secret" not in repr(c)


# --------------------------------------------------------------------------- bearer tokens


def test_bearer_token_registry(run_dedal, token_registry, sifs, tmp_path):
    ref = token_registry.ref("esd/tiny-mpi:v1")
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure")
    assert r.returncode == 1 and "requires authentication" in r.stderr

    wrong = {"DEDAL_REGISTRY_USER": USER, "DEDAL_REGISTRY_PASSWORD": "wrong"}
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure", env=wrong)
    assert r.returncode == 1
    assert "token server" in r.stderr and "refused" in r.stderr and "wrong user name or password" in r.stderr

    right = {"DEDAL_REGISTRY_USER": USER, "DEDAL_REGISTRY_PASSWORD": PASSWORD}
    r = run_dedal("publish", str(sifs["good"]), ref, "--insecure", "--json", env=right)
    assert r.returncode == 0, r.stderr
    _no_secret(r.stdout, r.stderr)
    scopes = {q.get("scope") for q in token_registry.bearer.requests if q["result"] == "issued"}
    actions = {(s.rsplit(":", 1)[0], frozenset(s.rsplit(":", 1)[1].split(","))) for s in scopes if s}
    # pushing asked for push rights (the registry's challenge lists the actions in either order)
    assert ("repository:esd/tiny-mpi", frozenset({"pull", "push"})) in actions
    assert token_registry.manifest("esd/tiny-mpi", "v1").json()["layers"][0]["mediaType"] == pub.SIF_LAYER_MEDIA_TYPE

    out = tmp_path / "t.sif"
    r = run_dedal("pull", ref, "-o", str(out), "--insecure", env=right)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == sifs["good"].read_bytes()
    r = run_dedal("images", token_registry.ref("esd/tiny-mpi"), "--insecure", "--json", env=right)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["tag"] == "v1"


# --------------------------------------------------------------------------- no leaks


@pytest.mark.parametrize("kind", ["htpasswd", "token"])
def test_secrets_never_in_logs_errors_or_reprs(kind, auth_registry, token_registry, sifs, reports, tmp_path, caplog):
    registry = auth_registry if kind == "htpasswd" else token_registry
    caplog.set_level(logging.DEBUG)  # everything: dedal, oras, urllib3
    good = reg.Credentials(USER, PASSWORD, "test")
    bad = reg.Credentials(USER, PASSWORD + "-wrong", "test")
    ref = registry.ref("esd/tiny-mpi:v1")

    res = pub.publish(
        sifs["good"], [ref], attachments=[reports["dir"]], access=Access(insecure=True, creds=good, backoff=0.01)
    )
    pulled = pub.pull(ref, tmp_path / "x.sif", access=Access(insecure=True, creds=good))
    listing = pub.list_images(registry.ref("esd/tiny-mpi"), access=Access(insecure=True, creds=good))
    info = pub.inspect_remote(ref, access=Access(insecure=True, creds=good))
    client = Access(insecure=True, creds=good).client(registry.host)
    client.ping()
    tokens = list(client._auth.tokens.values())
    with pytest.raises(reg.RegistryAuthError) as failed:
        pub.pull(ref, tmp_path / "y.sif", access=Access(insecure=True, creds=bad))

    texts = [
        caplog.text,
        json.dumps(res.to_json()),
        json.dumps(pulled.to_json()),
        json.dumps([e.to_json() for e in listing]),
        json.dumps(info),
        repr(client),
        str(client),
        repr(client._auth),
        repr(good),
        str(good),
        str(failed.value),
        repr(failed.value),
    ]
    for text in texts:
        _no_secret(text)
        assert PASSWORD + "-wrong" not in text
        for token in tokens:
            assert token not in text
    assert "refused" in str(failed.value)
    if kind == "token":
        assert tokens  # the bearer flow did run
    # nothing of it went into the registry either (labels, annotations, reports)
    for d in [res.digest] + [a.digest for a in res.attachments]:
        _no_secret(registry.manifest("esd/tiny-mpi", d).text)
