"""oras:// references: what parses, and the messages for what does not."""

from __future__ import annotations

import pytest

from dedal.errors import UserError
from dedal.stages.publish import Reference, default_pull_name, parse_reference

pytestmark = pytest.mark.registry


@pytest.mark.parametrize(
    "text, expected",
    [
        ("oras://127.0.0.1:5000/esd/esd-gpu:2024.06", Reference("127.0.0.1:5000", "esd/esd-gpu", "2024.06")),
        ("oras://registry.example.org/a/b/c", Reference("registry.example.org", "a/b/c", None)),
        ("oras://localhost/x_y__z:v1", Reference("localhost", "x_y__z", "v1")),
        ("oras://reg:443/esd/mpi@sha256:" + "a" * 64, Reference("reg:443", "esd/mpi", None, "sha256:" + "a" * 64)),
        ("oras://reg/esd/mpi:v1@sha256:" + "b" * 64, Reference("reg", "esd/mpi", "v1", "sha256:" + "b" * 64)),
    ],
)
def test_valid_references(text, expected):
    ref = parse_reference(text)
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty registry reference"),
        ("docker://reg/x:1", "docker:// references are not supported"),
        ("reg/x:1", "expected oras://"),
        ("oras://", "is not a registry host"),
        ("oras://reg", "no repository after the host"),
        ("oras://reg/", "no repository after the host"),
        ("oras://reg/Esd/mpi:v1", "must be lowercase"),
        ("oras://reg/esd//mpi:v1", "empty path component"),
        ("oras://reg/esd/mpi:-bad", "not a valid tag"),
        ("oras://reg/esd/mp!i:v1", "not a valid repository name component"),
        ("oras://reg/esd/mpi@sha256:xyz", "not a sha256 digest"),
        ("oras://re_g:5000/x:1", "not a registry host"),
    ],
)
def test_bad_references(text, message):
    with pytest.raises(UserError, match=message):
        parse_reference(text)


def test_credentials_in_reference_are_refused_without_echo():
    with pytest.raises(UserError) as info:
        parse_reference("oras://alice:TopSecret42@reg.example.org/esd/mpi:v1")
    assert "TopSecret42" not in str(info.value)
    assert "credentials must not be written into the registry reference" in str(info.value)


def test_repository_only_and_plain_host_form():
    assert parse_reference("127.0.0.1:5000/esd/mpi", require_scheme=False, repository_only=True) == Reference(
        "127.0.0.1:5000", "esd/mpi"
    )
    with pytest.raises(UserError, match="expected a repository"):
        parse_reference("oras://reg/esd/mpi:v1", repository_only=True)


def test_default_pull_name_is_apptainers():
    assert default_pull_name(parse_reference("oras://reg/esd/esd-gpu:2024.06")) == "esd-gpu_2024.06.sif"
