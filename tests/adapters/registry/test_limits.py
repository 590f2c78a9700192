"""A registry is input: what dedal reads of its answers whole is bounded (issue 39, "a file
that is not a regular file, or too large, refused with one line").

A flooding server speaks enough of the registry API to be asked (``GET /v2/``) and then
answers a manifest, a bearer token or an error with a body that never ends, with or without
a Content-Length: ``dedal pull`` stops reading after ``ANSWER_LIMIT`` (4 MiB), says so in
one line, exits 2 and writes nothing; a HEAD's Content-Length (what a GET would send) is
no body and passes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

from dedal.adapters.registry import ANSWER_LIMIT, Access, TooLarge

pytestmark = pytest.mark.reliability

FLOOD = 64 << 20  # bytes the server offers at most (the client must stop long before)


class Flood:
    """``mode``: "manifest" (an endless manifest), "length" (a manifest whose
    Content-Length says 1 GiB), "token" (a bearer challenge whose token server floods),
    "error" (a 404 whose error body floods), "head" (a HEAD answered with a 1 GiB
    Content-Length and no body)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent: List[int] = []  # bytes of the flood each answer got out before the client hung up
        flood = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the body ends where the connection does

            def log_message(self, *a) -> None:  # quiet
                pass

            def _flood(self, status: int, headers: Dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                sent = 0
                try:
                    while sent < FLOOD:
                        self.wfile.write(b" " * (1 << 16))
                        sent += 1 << 16
                except OSError:  # the client closed the connection
                    pass
                flood.sent.append(sent)

            def do_HEAD(self) -> None:
                self.send_response(200)
                self.send_header("Content-Length", str(1 << 30))
                self.send_header("Docker-Content-Digest", "sha256:" + "0" * 64)
                self.end_headers()

            def do_GET(self) -> None:
                if flood.mode == "token" and self.path.startswith("/v2/") and "Authorization" not in self.headers:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", f'Bearer realm="http://{flood.host}/token",service="flood"')
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif self.path == "/v2/":
                    self.send_response(200)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                elif self.path.startswith("/token"):
                    self._flood(200, {"Content-Type": "application/json"})
                elif flood.mode == "error":
                    self._flood(404, {"Content-Type": "application/json"})
                elif flood.mode == "length":
                    self._flood(
                        200,
                        {"Content-Type": "application/vnd.oci.image.manifest.v1+json", "Content-Length": str(1 << 30)},
                    )
                else:
                    self._flood(200, {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flood() -> Iterator:
    servers: List[Flood] = []

    def make(mode: str) -> Flood:
        servers.append(Flood(mode))
        return servers[-1]

    yield make
    for s in servers:
        s.stop()


@pytest.mark.parametrize(
    "mode,expect",
    [
        (
            "manifest",
            "the answer to GET http://{host}/v2/esd/x/manifests/v1: too large (more than 4194304 bytes; "
            "dedal reads at most 4 MiB of it)",
        ),
        (
            "length",
            "the answer to GET http://{host}/v2/esd/x/manifests/v1: too large (1073741824 bytes; "
            "dedal reads at most 4 MiB of it)",
        ),
        (
            "token",
            "the answer of token server http://{host}/token: too large (more than 4194304 bytes; "
            "dedal reads at most 4 MiB of it)",
        ),
    ],
)
def test_a_flooding_answer_is_refused_in_one_line(mode: str, expect: str, flood, run_dedal, tmp_path: Path) -> None:
    server = flood(mode)
    out = tmp_path / "out"
    out.mkdir()
    r = run_dedal("pull", f"oras://{server.host}/esd/x:v1", "-o", str(out / "x.sif"), timeout=60)
    lines = [line for line in r.stderr.strip().splitlines() if not line.startswith("[")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == "dedal: error: " + expect.format(host=server.host), lines[0]
    assert list(out.iterdir()) == []
    # what came over the wire before the client hung up: the limit and what was on its way
    assert sum(server.sent) < ANSWER_LIMIT + (8 << 20), server.sent


def test_an_error_answer_is_read_for_its_codes_only_while_small(flood) -> None:
    """A 404 whose body floods is still the 404 (its error codes left out), read no further."""
    server = flood("error")
    client = Access(insecure=True).client(server.host)
    with pytest.raises(Exception) as caught:
        client.get_manifest_raw("esd/x", "v1")
    assert not isinstance(caught.value, TooLarge)  # the answer to the question is 'not found'
    assert str(caught.value).endswith("/v2/esd/x/manifests/v1: HTTP 404 Not Found"), caught.value
    assert sum(server.sent) < ANSWER_LIMIT + (8 << 20), server.sent


def test_a_head_is_no_body_whatever_its_content_length(flood) -> None:
    client = Access(insecure=True).client(flood("head").host)
    assert client.head_manifest("esd/x", "v1") == "sha256:" + "0" * 64
