"""`dedal layers push`: a store's layers seed a remote layer cache (a real local registry,
layers built with the Spack stand-in), with the push the build uses; a build on another
machine, without a source mirror, then pulls them all."""

from __future__ import annotations

import json

import pytest

from dedal.model.layers import LayerStore
from dedal.stages.building.cache import cache_tag
from tests.fixtures.tiny import TINY_PACKAGES, make_env

pytestmark = [pytest.mark.registry, pytest.mark.usefixtures("as_root")]


def _push(run_dedal, tiny, *args):
    res = run_dedal("layers", "push", *args, "--insecure", "--json", env=tiny.env)
    return res, (json.loads(res.stdout) if res.stdout.strip() else {})


def _names(labels):
    return sorted(label.split("@")[0] for label in labels)


def _tags(registry, repo="esd/layers"):
    r = registry.api("GET", f"/v2/{repo}/tags/list")
    return sorted(r.json().get("tags") or []) if r.status_code == 200 else []


def test_layers_push_seeds_a_cache_that_a_build_without_a_mirror_pulls(run_dedal, registry, tmp_path):  # noqa: F811
    cache = registry.ref("esd/layers")
    first = make_env(tmp_path / "a")
    res = run_dedal("build", str(first.env_file), env=first.env)  # no cache: the layers are only in the store
    assert res.returncode == 0, res.stderr
    store = LayerStore(first.store)
    app = next(m for m in store.manifests() if m.name == "dedal-app")

    # one layer by a prefix of its key, then the plan's layers: the one sent is skipped
    res, one = _push(run_dedal, first, cache, app.key[:20])
    assert res.returncode == 0, res.stderr
    assert _names(one["pushed"]) == ["dedal-app"] and one["skipped"] == [] and one["bytes_pushed"] == app.size
    assert _tags(registry) == [cache_tag(app.key)]
    res, plan = _push(run_dedal, first, cache, "--plan", str(first.data / "work" / "tiny" / "plan.json"))
    assert res.returncode == 0, res.stderr
    assert _names(plan["pushed"]) == sorted(set(TINY_PACKAGES) - {"dedal-app"}) and _names(plan["skipped"]) == [
        "dedal-app"
    ]
    assert plan["problems"] == [] and plan["not_sent"] == [] and plan["ref"] == cache
    assert _tags(registry) == sorted(cache_tag(k) for k in store.keys())
    # everything again, in words: nothing sent
    res = run_dedal("layers", "push", cache, "--insecure", env=first.env)
    assert res.returncode == 0, res.stderr
    assert "0 pushed" in res.stdout and "5 there already" in res.stdout
    art = registry.manifest("esd/layers", cache_tag(app.key)).json()
    assert art["artifactType"] == "application/vnd.dedal.layer.v1"
    assert art["layers"][0]["digest"] == f"sha256:{app.sha256}"

    # another machine: no mirror, a Spack that would fail every build; all comes from the cache
    second = make_env(tmp_path / "b", fail=TINY_PACKAGES)
    res = run_dedal(
        "build",
        str(second.env_file),
        "--cache",
        cache,
        "--insecure",
        "--json",
        env=dict(second.env, DEDAL_MIRROR=str(tmp_path / "no-mirror")),
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["built"] == [] and _names(summary["cache"]["pulled"]) == TINY_PACKAGES
    assert {m.key: m.sha256 for m in LayerStore(second.store).manifests()} == {
        m.key: m.sha256 for m in store.manifests()
    }


def test_layers_push_refuses_bad_input_before_sending_anything(run_dedal, registry, tmp_path):  # noqa: F811
    tiny = make_env(tmp_path)
    res = run_dedal("build", str(tiny.env_file), env=tiny.env)
    assert res.returncode == 0, res.stderr
    key = LayerStore(tiny.store).keys()[0]
    cases = [
        (["https://h/esd/layers"], "https:// references are not supported"),
        ([registry.ref("esd/layers:tag"), key], ""),
        ([registry.ref("esd/layers"), key, "no-such-layer"], "'no-such-layer' matches 0 layers"),
        ([registry.ref("esd/layers"), "--plan", str(tmp_path / "missing.json")], "missing.json"),
    ]
    for args, expect in cases:
        res, _ = _push(run_dedal, tiny, *args)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("dedal: error: "), (args, res.stderr)
        assert expect in lines[0], (args, lines)
    assert registry.api("GET", "/v2/_catalog").json().get("repositories") in (None, [])


def test_layers_push_from_an_empty_store_is_refused(run_dedal, registry, tmp_path):  # noqa: F811
    res = run_dedal("layers", "--layers", str(tmp_path / "empty"), "push", registry.ref("esd/layers"), "--insecure")
    assert res.returncode == 2 and "holds no layers" in res.stderr, res.stderr
    assert not (tmp_path / "empty").exists()
