"""dedal.adapters.pypi against the loopback index of tests/fixtures/pypi.py: a recorded
PyPI simple-index page and the real tomli-2.0.1 sdist. No network."""

from __future__ import annotations

import hashlib

import pytest

from dedal.adapters import pypi
from tests.fixtures.pypi import TOMLI_PATH, TOMLI_SDIST, TOMLI_SHA


def test_recorded_data_is_the_sdist_spack_verifies():
    assert hashlib.sha256(TOMLI_SDIST.read_bytes()).hexdigest() == TOMLI_SHA


@pytest.mark.parametrize(
    "url, project",
    [
        ("https://files.pythonhosted.org/packages/source/t/tomli/tomli-2.0.1.tar.gz", "tomli"),
        ("https://pypi.io/packages/source/M/Mako/Mako-1.2.4.tar.gz", "Mako"),
        ("https://files.pythonhosted.org/packages/py3/p/pip/pip-23.1.2-py3-none-any.whl", "pip"),  # Spack's wheels
        ("https://files.pythonhosted.org/packages/c0/3f/d7af/tomli-2.0.1.tar.gz", None),  # hashed: not an alias
        ("https://github.com/arbor-sim/arbor/releases/download/v0.9.0/arbor-v0.9.0-full.tar.gz", None),
        ("http://deb.debian.org/debian/pool/main/t/tomli/tomli_2.0.1.orig.tar.gz", None),
        ("", None),
    ],
)
def test_project_of(url, project):
    assert pypi.project_of(url) == project


def test_normalize():
    assert pypi.normalize("Typing_Extensions") == "typing-extensions"
    assert pypi.normalize("meson.python") == "meson-python"


def test_find_picks_the_file_with_the_recipes_sha256(pypi_index):
    index = pypi.PyPI(pypi_index.index)
    item = index.find("tomli", TOMLI_SHA.upper())
    assert item is not None and item.filename == "tomli-2.0.1.tar.gz"
    assert item.url == pypi_index.url + "/files" + TOMLI_PATH
    assert index.find("Tomli", "0" * 64) is None
    assert pypi_index.requests == ["/simple/tomli/", "/simple/tomli/"]  # the normalized name


def test_download_checks_the_bytes(pypi_index, tmp_path):
    index = pypi.PyPI(pypi_index.index)
    dest = tmp_path / "_source-cache" / "archive" / "de" / f"{TOMLI_SHA}.tar.gz"
    index.download(index.find("tomli", TOMLI_SHA), dest)
    assert dest.read_bytes() == TOMLI_SDIST.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]


def test_download_refuses_other_bytes_and_leaves_nothing(pypi_index, tmp_path):
    pypi_index.files[TOMLI_PATH] = TOMLI_SDIST.read_bytes()[:-1] + b"x"
    index = pypi.PyPI(pypi_index.index)
    dest = tmp_path / "d" / "f.tar.gz"
    with pytest.raises(pypi.PyPIError, match="differs from the index's de526c12"):
        index.download(index.find("tomli", TOMLI_SHA), dest)
    assert list(dest.parent.iterdir()) == []


def test_errors_name_the_url_and_status(pypi_index, tmp_path):
    index = pypi.PyPI(pypi_index.index)
    with pytest.raises(pypi.PyPIError, match=r"simple/no-such/: HTTP 404") as exc:
        index.find("no_such", TOMLI_SHA)
    assert exc.value.status == 404
    item = index.find("tomli", TOMLI_SHA)
    del pypi_index.files[TOMLI_PATH]
    with pytest.raises(pypi.PyPIError, match="HTTP 404"):
        index.download(item, tmp_path / "f.tar.gz")
    assert list(tmp_path.iterdir()) == []


def test_unreachable_index_is_one_error():
    index = pypi.PyPI("http://127.0.0.1:9/simple", timeout=5)
    with pytest.raises(pypi.PyPIError, match="127.0.0.1:9/simple/tomli/"):
        index.find("tomli", TOMLI_SHA)
