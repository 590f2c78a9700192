"""The rebuild inputs an image carries: local repositories and includes copied and named
inside the image, an env.yaml with every value explicit, no path of the building machine."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import yaml

from dedal.model.image_options import ImageOptions
from dedal.stages.assemble import provenance


def _checkout(where: Path) -> dict:
    repo = where / "recipes" / "repo"
    (repo / "packages" / "app" / "__pycache__").mkdir(parents=True)
    (repo / "repo.yaml").write_text("repo:\n  namespace: mine\n")
    (repo / "packages" / "app" / "package.py").write_text("class App: pass\n")
    (repo / "packages" / "app" / "__pycache__" / "package.cpython-313.pyc").write_bytes(b"\x00stale")
    inc = where / "site.yaml"
    inc.write_text("packages: {}\n")
    return {
        "spack": {
            "specs": ["app"],
            "repos": [str(repo), "$spack/var/spack/repos/builtin"],
            "include": [str(inc)],
            "concretizer": {"unify": True},
        }
    }


def test_relocated_and_the_same_from_any_checkout(tmp_path):
    one, two = _checkout(tmp_path / "one"), _checkout(tmp_path / "elsewhere" / "two")
    assert provenance.inputs_digest(one) == provenance.inputs_digest(two)
    assert provenance.in_image(one)["spack"]["repos"] == ["/opt/dedal/env/repos/0", "$spack/var/spack/repos/builtin"]
    assert provenance.in_image(one)["spack"]["include"] == ["/opt/dedal/env/includes/0.yaml"]
    assert one["spack"]["repos"][0].startswith(str(tmp_path))  # the caller's manifest is left as it was
    (tmp_path / "elsewhere/two/recipes/repo/packages/app/package.py").write_text("class App: version = 2\n")
    assert provenance.inputs_digest(one) != provenance.inputs_digest(two)  # a changed recipe counts

    env_dir = tmp_path / "img" / "opt/dedal/env"
    env_dir.mkdir(parents=True)
    provenance.copy_inputs(one, env_dir)
    files = sorted(str(p.relative_to(env_dir)) for p in env_dir.rglob("*") if p.is_file())
    assert files == ["includes/0.yaml", "repos/0/packages/app/package.py", "repos/0/repo.yaml"]  # no __pycache__

    plan = SimpleNamespace(env_name="app", tag="v1", base_image="host", install_root="/opt/sw", view="/opt/view")
    env_file = tmp_path / "one" / "env.yaml"
    env_file.write_text(
        yaml.safe_dump(
            {
                "spack": {"specs": ["app"]},
                "dedal": {
                    "name": "app",
                    "lock": "x.lock",
                    "verify": {"ranks": 4},
                    "registry": "oras://r.example/x",
                    "description": "old",
                },
            }
        )
    )
    section = provenance.dedal_section(plan, ImageOptions(labels={"team": "x"}, env_file=env_file), only=[])
    assert section == {
        "name": "app",
        "tag": "v1",
        "base_image": "host",
        "install_root": "/opt/sw",
        "view": "/opt/view",
        "verify": {"ranks": 4},
        "registry": "oras://r.example/x",
        "labels": {"team": "x"},
    }
    base_def = tmp_path / "debian-x.yaml"
    base_def.write_text("name: debian-x\n")
    provenance.write_rebuild_inputs(env_dir, one, section, base_def)
    written = yaml.safe_load((env_dir / "env.yaml").read_text())
    assert written["spack"]["repos"] == ["repos/0", "$spack/var/spack/repos/builtin"]
    assert written["spack"]["include"] == ["includes/0.yaml"] and written["dedal"] == section
    assert (env_dir / "base.yaml").read_text() == "name: debian-x\n"
    assert str(tmp_path) not in (env_dir / "env.yaml").read_text()

    # rebuilt from the carried copy: the manifest it makes names the same things, the same way
    from dedal.model.envfile import load_env

    again = load_env(env_dir / "env.yaml").spack_yaml()
    assert again["spack"]["repos"][0] == str(env_dir / "repos/0")
    assert provenance.inputs_digest(again) == provenance.inputs_digest(one)
    assert provenance.relocated(again, "") == provenance.relocated(one, "")
