"""The registry client's choice of scheme: plain http without --insecure only for the
registries Apptainer reaches that way too (this machine, a private network)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import requests

from dedal.adapters.registry import transport
from dedal.adapters.registry.client import RegistryClient
from dedal.model.oci import local_registry
from dedal.model.oci import RegistryError


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:5000",
        "localhost:5000",
        "reg.localhost",
        "[::1]:5000",
        "::1",
        "127.0.1.1:5000",
        "10.1.2.3:5000",
        "172.16.0.9",
        "192.168.1.1:443",
    ],
)
def test_local_registries(host):
    assert local_registry(host)


@pytest.mark.parametrize(
    "host", ["ghcr.io", "registry.example.org:5000", "8.8.8.8:5000", "172.32.0.1:5000", "localhost.example.org"]
)
def test_remote_registries(host):
    assert not local_registry(host)


class _NoTLS:
    """A session whose https probe fails with ``exc`` (a plain-HTTP server answering a TLS
    hello: SSLError; nothing listening: ConnectionError); plain http answers unless
    ``http_down``."""

    def __init__(self, exc: Exception, http_down: bool = False) -> None:
        self.exc = exc
        self.http_down = http_down
        self.asked = []

    def get(self, url, **kw):
        self.asked.append((url, kw.get("verify")))
        if url.startswith("https://") or self.http_down:
            raise self.exc if url.startswith("https://") else requests.exceptions.ConnectionError("refused")
        return SimpleNamespace(close=lambda: None)  # an answer whose body the probe never reads


@pytest.mark.parametrize(
    "exc", [requests.exceptions.SSLError("wrong version number"), requests.exceptions.ConnectionError("refused")]
)
def test_scheme_fallback(exc):
    local = RegistryClient("127.0.0.1:5000", session=_NoTLS(exc))
    assert local.base == "http://127.0.0.1:5000"
    assert local.session.asked[0] == ("https://127.0.0.1:5000/v2/", True)  # https first, certificate verified
    remote = RegistryClient("registry.example.org:5000", session=_NoTLS(exc))
    with pytest.raises(RegistryError, match="pass --insecure"):
        _ = remote.base
    assert remote.session.asked == [("https://registry.example.org:5000/v2/", True)]  # never plain http unasked
    assert RegistryClient("registry.example.org:5000", session=_NoTLS(exc), insecure=True).base.startswith("http://")


def test_local_registry_not_there_is_one_error():
    """Nothing listening on either scheme: one error at once, no retries (as Apptainer)."""
    gone = RegistryClient("127.0.0.1:9", session=_NoTLS(requests.exceptions.ConnectionError("refused"), http_down=True))
    with pytest.raises(RegistryError, match=r"unreachable over https \(.*\) and http"):
        _ = gone.base
    assert [u for u, _ in gone.session.asked] == ["https://127.0.0.1:9/v2/", "http://127.0.0.1:9/v2/"]


# ----------------------------------------------------------------------------- a registry that never answers
# (issue 35): it took the connection and said nothing; that was 92 s of silence, 337 s with
# --insecure (five attempts of the 60 s stall timeout), before the error.


def test_timeouts_first_contact_stall_and_sending():
    c = RegistryClient("registry.example.org", timeout=60)
    assert c._timeouts("GET /v2/", first=True) == (transport.CONNECT_TIMEOUT, transport.ANSWER_TIMEOUT)
    assert c._timeouts("GET /v2/x/manifests/v1") == (transport.CONNECT_TIMEOUT, 60)
    # urllib3 bounds sending a body by the connect timeout: an upload may stall as long as an answer
    assert c._timeouts("PUT /v2/x/blobs/uploads/1", sending=True) == (60, 60)
    assert RegistryClient("h", timeout=3)._timeouts("GET /v2/", first=True) == (3, 3)


@pytest.mark.reliability
@pytest.mark.parametrize("insecure", [False, True])
def test_a_registry_that_never_answers_is_one_error_naming_it(silent_server, monkeypatch, insecure):
    monkeypatch.setattr(transport, "CONNECT_TIMEOUT", 1.0)
    monkeypatch.setattr(transport, "ANSWER_TIMEOUT", 1.0)
    c = RegistryClient(silent_server.host, insecure=insecure)
    started = time.monotonic()
    with pytest.raises(RegistryError) as info:
        c.tags("esd/tiny")
    took = time.monotonic() - started
    assert info.value.one_line() == (
        f"registry {silent_server.host} unreachable over https (no answer in 1 s) and http (no answer in 1 s)"
    )
    assert len(silent_server.accepted) == 2, "https once, plain http once: no retries of a registry that is mute"
    assert took < 10, f"{took:.1f} s: the first contact waits ANSWER_TIMEOUT per scheme, not the stall timeout"


# ----------------------------------------------------------------------------- the deadline counts time without progress
# (issue 39, item 4): a stalled upload took attempts x timeout (5 x 60 s); the deadline
# bounds it now, and a transfer that moves is never cut by it.


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s


def test_progress_starts_the_deadline_again(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(transport, "time", clock)
    c = RegistryClient("registry.example.org", timeout=60, deadline=100)
    clock.now += 90
    assert c._timeouts("PUT /v2/x/blobs/uploads/1", sending=True) == (10, 10)  # cut to what is left
    c.progressed(1 << 20)  # a block of the blob went out
    clock.now += 90
    assert c._timeouts("PUT /v2/x/blobs/uploads/1", sending=True) == (10, 10), "an upload that moves is not cut"
    clock.now += 11
    with pytest.raises(RegistryError, match=r"gave up: no progress within the registry operation's deadline of 100 s"):
        c._timeouts("HEAD /v2/x/blobs/sha256:00")


def test_the_default_deadline_is_a_few_minutes():
    from dedal.model.config import SETTINGS

    default = next(s for s in SETTINGS if s.key == "registry_deadline_s")
    assert RegistryClient("h").deadline == transport.DEADLINE == default.default({}) == 180.0
    assert "without progress" in default.help
