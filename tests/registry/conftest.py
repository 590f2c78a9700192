"""Fixtures for the registry tests: real Debian ``docker-registry`` servers on 127.0.0.1
(anonymous, htpasswd, bearer token), real SIF files made with siftool, and a relaying
proxy that injects faults (dropped connections, 503) and counts what passes through.

Every server is started on a free loopback port with its own storage directory under
tmp_path and stopped by PID at the end of the test.
"""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from dedal.model.sif import host_arch

SIFTOOL_FALLBACK = Path.home() / ".cache" / "dedal" / "bin" / "siftool"
USER, PASSWORD = "esd-bot", "s3cret-Pa55word!"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def siftool() -> str:
    found = shutil.which("siftool") or (str(SIFTOOL_FALLBACK) if SIFTOOL_FALLBACK.exists() else None)
    if not found:
        pytest.skip("siftool is not installed (./setup.sh installs it)")
    return found


def _need(tool: str) -> str:
    found = shutil.which(tool)
    if not found:
        pytest.skip(f"{tool} is not installed (./setup.sh installs it)")
    return found


# --------------------------------------------------------------------------- registries


@dataclass
class Registry:
    host: str  # 127.0.0.1:PORT
    root: Path  # storage directory
    log: Path
    proc: subprocess.Popen
    auth: Optional[Tuple[str, str]] = None
    bearer: Optional["TokenServer"] = None

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def ref(self, repo_tag: str) -> str:
        return f"oras://{self.host}/{repo_tag}"

    def api(self, method: str, path: str, **kw) -> requests.Response:
        """A raw registry API call, authenticated like a docker client would."""
        headers = kw.pop("headers", {})
        if self.bearer is not None:
            m = re.match(r"/v2/(.+?)/(manifests|blobs|tags|referrers)/", path)
            scope = f"repository:{m.group(1)}:pull,push,delete" if m else "registry:catalog:*"
            headers["Authorization"] = f"Bearer {self.bearer.issue(USER, scope)}"
            return requests.request(method, self.url + path, headers=headers, timeout=30, **kw)
        return requests.request(method, self.url + path, auth=self.auth, headers=headers, timeout=30, **kw)

    def manifest(self, repo: str, ref: str) -> requests.Response:
        return self.api("GET", f"/v2/{repo}/manifests/{ref}",
                        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, "
                                           "application/vnd.oci.image.index.v1+json"})

    def blob_file(self, digest: str) -> Path:
        hexd = digest.split(":", 1)[1]
        return self.root / "docker" / "registry" / "v2" / "blobs" / "sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_registry(base: Path, auth_yaml: str = "", auth: Optional[Tuple[str, str]] = None) -> Registry:
    exe = _need("docker-registry")
    base.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    root = base / "storage"
    root.mkdir(exist_ok=True)
    cfg = base / "config.yml"
    cfg.write_text(
        "version: 0.1\n"
        "log: {level: info, fields: {service: registry}}\n"
        "storage:\n"
        "  cache: {blobdescriptor: inmemory}\n"
        f"  filesystem: {{rootdirectory: {root}}}\n"
        "  delete: {enabled: true}\n"
        "http:\n"
        f"  addr: 127.0.0.1:{port}\n"
        + auth_yaml
    )
    log = base / "registry.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([exe, "serve", str(cfg)], stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    reg = Registry(f"127.0.0.1:{port}", root, log, proc, auth)
    deadline = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            pytest.fail(f"docker-registry exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            r = requests.get(reg.url + "/v2/", timeout=2)
            if r.status_code in (200, 401):
                return reg
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            reg.stop()
            pytest.fail(f"docker-registry did not answer /v2/ within 20 s: {log.read_text()[-2000:]}")
        time.sleep(0.1)


@pytest.fixture
def registry(tmp_path: Path):
    reg = start_registry(tmp_path / "registry")
    yield reg
    reg.stop()


@pytest.fixture
def auth_registry(tmp_path: Path):
    """A registry with htpasswd (bcrypt) authentication: user USER, password PASSWORD."""
    _need("htpasswd")
    base = tmp_path / "auth-registry"
    base.mkdir()
    line = subprocess.run(["htpasswd", "-Bbn", USER, PASSWORD], check=True, capture_output=True, text=True).stdout
    (base / "htpasswd").write_text(line.strip() + "\n")
    reg = start_registry(base, "auth:\n  htpasswd:\n    realm: dedal-test\n"
                               f"    path: {base / 'htpasswd'}\n", auth=(USER, PASSWORD))
    yield reg
    reg.stop()


# --------------------------------------------------------------------------- bearer tokens


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """A minimal Docker token server: checks Basic credentials and issues RS256 JWTs
    (signed with openssl) that docker-registry verifies through the x5c certificate."""

    def __init__(self, base: Path, service: str = "dedal-test", issuer: str = "dedal-test-issuer") -> None:
        openssl = _need("openssl")
        self.base = base
        self.service = service
        self.issuer = issuer
        self.key = base / "token.key"
        self.cert = base / "token.crt"
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(self.key),
                        "-out", str(self.cert), "-days", "2", "-subj", "/CN=dedal-test-token"],
                       check=True, capture_output=True)
        der = subprocess.run([openssl, "x509", "-in", str(self.cert), "-outform", "DER"], check=True,
                             capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.requests: List[Dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                q = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                auth = self.headers.get("Authorization", "")
                user = None
                if auth.startswith("Basic "):
                    u, _, p = base64.b64decode(auth[6:]).decode().partition(":")
                    if (u, p) != (USER, PASSWORD):
                        self._send(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
                        server.requests.append({"user": u, "result": "refused", **q})
                        return
                    user = u
                if user is None:
                    self._send(401, {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]})
                    server.requests.append({"user": "", "result": "anonymous refused", **q})
                    return
                server.requests.append({"user": user, "result": "issued", **q})
                self._send(200, {"token": server.issue(user, q.get("scope", "")), "expires_in": 300})

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def issue(self, user: str, scope: str) -> str:
        access = []
        for part in scope.split(" "):
            if part == "*":
                access.append({"type": "repository", "name": "*", "actions": ["*"]})
            elif part.count(":") >= 2:
                typ, rest = part.split(":", 1)
                name, actions = rest.rsplit(":", 1)
                access.append({"type": typ, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.x5c]}
        claims = {"iss": self.issuer, "sub": user, "aud": self.service, "exp": now + 300, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.key)], input=signing_input.encode(),
                             check=True, capture_output=True).stdout
        return f"{signing_input}.{_b64url(sig)}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def token_registry(tmp_path: Path):
    """A registry that wants bearer tokens from a token server (Basic USER/PASSWORD there)."""
    base = tmp_path / "token-registry"
    base.mkdir()
    tokens = TokenServer(base)
    reg = start_registry(base, "auth:\n  token:\n"
                               f"    realm: {tokens.realm}\n"
                               f"    service: {tokens.service}\n"
                               f"    issuer: {tokens.issuer}\n"
                               f"    rootcertbundle: {tokens.cert}\n")
    reg.bearer = tokens
    yield reg
    reg.stop()
    tokens.stop()


# --------------------------------------------------------------------------- fault-injecting proxy


@dataclass
class Seen:
    method: str
    path: str
    status: int  # 0: connection dropped by the proxy


@dataclass
class FaultProxy:
    """Relays HTTP to a registry. ``faults`` are (method, path-substring, action, times):
    action "drop" closes the connection half way through (request or response body),
    "reset" does so with a TCP reset (RST), "hang" reads the request and never answers
    (until the proxy stops), an int answers that status, a (status, headers) tuple that
    status with those headers (e.g. Retry-After). With ``referrers_api`` it adds what an
    OCI 1.1 registry does: the OCI-Subject header and GET /v2/<name>/referrers/<digest>."""

    upstream: str
    faults: List[list] = field(default_factory=list)
    referrers_api: bool = False
    seen: List[Seen] = field(default_factory=list)
    referrers: Dict[str, List[dict]] = field(default_factory=dict)
    host: str = ""
    stopped: threading.Event = field(default_factory=threading.Event)

    def fault(self, method: str, needle: str, action, times: int = 1) -> None:
        self.faults.append([method, needle, action, times])

    def _take(self, method: str, path: str):
        for f in self.faults:
            if f[0] == method and f[1] in path and f[3] > 0:
                f[3] -= 1
                return f[2]
        return None

    def uploads(self) -> List[str]:
        """Digests of completed blob uploads (PUT .../blobs/uploads/...?digest=, 201)."""
        out = []
        for s in self.seen:
            if s.method == "PUT" and "/blobs/uploads/" in s.path and s.status == 201:
                out.append(parse_qs(urlsplit(s.path).query)["digest"][0])
        return out

    def count(self, method: str, needle: str, status: Optional[int] = None) -> int:
        return sum(1 for s in self.seen if s.method == method and needle in s.path
                   and (status is None or s.status == status))


def _make_proxy(upstream: str, referrers_api: bool = False) -> Tuple[FaultProxy, ThreadingHTTPServer]:
    proxy = FaultProxy(upstream, referrers_api=referrers_api)
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a):
            pass

        def _relay(self):
            method, path = self.command, self.path
            length = int(self.headers.get("Content-Length") or 0)
            with lock:
                action = proxy._take(method, path)
            if action in ("drop", "reset") and method in ("PUT", "PATCH", "POST") and length:
                self.rfile.read(max(1, length // 2))
                proxy.seen.append(Seen(method, path, 0))
                self._break(action)
                return
            body = self.rfile.read(length) if length else None
            if action == "hang":
                proxy.seen.append(Seen(method, path, 0))
                proxy.stopped.wait(120)  # the client's stall timeout ends it first
                self.close_connection = True
                return
            if isinstance(action, int) or isinstance(action, tuple):
                status, extra_headers = action if isinstance(action, tuple) else (action, {})
                proxy.seen.append(Seen(method, path, status))
                self._answer(status, {"Content-Type": "application/json", **extra_headers},
                             b'{"errors":[{"code":"UNAVAILABLE","message":"injected by the test proxy"}]}')
                return
            if proxy.referrers_api and method == "GET" and "/referrers/" in path:
                digest = urlsplit(path).path.rsplit("/", 1)[1]
                index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                         "manifests": proxy.referrers.get(digest, [])}
                proxy.seen.append(Seen(method, path, 200))
                self._answer(200, {"Content-Type": "application/vnd.oci.image.index.v1+json"},
                             json.dumps(index).encode())
                return
            conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
            conn.request(method, path, body=body, headers=headers)  # Host is relayed: Locations point here
            resp = conn.getresponse()
            data = resp.read()
            extra = {}
            if (proxy.referrers_api and method == "PUT" and "/manifests/" in path and resp.status == 201 and body):
                try:
                    m = json.loads(body)
                except ValueError:
                    m = {}
                if isinstance(m, dict) and isinstance(m.get("subject"), dict):
                    subject = m["subject"]["digest"]
                    desc = {"mediaType": m.get("mediaType"), "digest": "sha256:" + hashlib.sha256(body).hexdigest(),
                            "size": len(body), "artifactType": m.get("artifactType"),
                            "annotations": m.get("annotations") or {}}
                    proxy.referrers.setdefault(subject, []).append(desc)
                    extra["OCI-Subject"] = subject
            proxy.seen.append(Seen(method, path, resp.status))
            hdrs = {k: v for k, v in resp.getheaders() if k.lower() not in ("connection", "transfer-encoding",
                                                                               "content-length")}
            hdrs.update(extra)
            if action in ("drop", "reset") and method == "GET" and len(data) > 1:
                proxy.seen[-1].status = 0
                self.send_response(resp.status)
                for k, v in hdrs.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self._break(action)
                return
            self._answer(resp.status, hdrs, data, head=method == "HEAD", length=resp.getheader("Content-Length"))

        def _break(self, action):
            """End the connection half way: FIN ("drop") or RST ("reset")."""
            self.close_connection = True
            if action == "reset":
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)

        def _answer(self, status, headers, data, head=False, length=None):
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", length if head and length else str(len(data)))
            self.end_headers()
            if not head:
                self.wfile.write(data)

        do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _relay

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    proxy.host = f"127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return proxy, httpd


@pytest.fixture
def proxy_for():
    """proxy_for(registry, referrers_api=False) -> FaultProxy relaying to that registry."""
    servers = []

    def _make(reg: Registry, referrers_api: bool = False) -> FaultProxy:
        proxy, httpd = _make_proxy(reg.host, referrers_api)
        httpd.proxy = proxy  # type: ignore[attr-defined]
        servers.append(httpd)
        return proxy

    yield _make
    for httpd in servers:
        httpd.proxy.stopped.set()  # type: ignore[attr-defined]
        httpd.shutdown()
        httpd.server_close()


# --------------------------------------------------------------------------- SIF files

LABELS = {
    "org.dedal.environment": "tiny-mpi",
    "org.dedal.lock-hash": "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "org.dedal.spack-commit": "e8f8cf8543b31ff6ba81a5ab0e515bc9a4856384",
}

_ARCH_CODE = {"386": 1, "amd64": 2, "arm": 3, "arm64": 4, "ppc64": 5, "ppc64le": 6, "s390x": 11, "riscv64": 12}


def make_sif(path: Path, *, arch: str, payload: bytes, labels: Optional[dict] = None) -> Path:
    """A real SIF: siftool new + JSON.Labels + a squashfs primary system partition."""
    tool = siftool()
    mksquashfs = _need("mksquashfs")
    work = path.parent / f".{path.name}.work"
    (work / "root" / "opt").mkdir(parents=True)
    (work / "root" / "opt" / "payload.bin").write_bytes(payload)
    (work / "root" / "hello.txt").write_text("hello from a dedal test image\n")
    sq = work / "rootfs.sqfs"
    subprocess.run([mksquashfs, str(work / "root"), str(sq), "-noappend", "-quiet", "-no-progress",
                    "-all-root"], check=True, capture_output=True)
    subprocess.run([tool, "new", str(path)], check=True, capture_output=True)
    if labels is not None:
        (work / "labels.json").write_text(json.dumps(labels))
        subprocess.run([tool, "add", str(path), str(work / "labels.json"), "--datatype", "3", "--groupid", "1",
                        "--filename", "labels.json"], check=True, capture_output=True)
    subprocess.run([tool, "add", str(path), str(sq), "--datatype", "4", "--parttype", "2", "--partfs", "1",
                    "--partarch", str(_ARCH_CODE[arch]), "--groupid", "1"], check=True, capture_output=True)
    shutil.rmtree(work)
    return path


@pytest.fixture(scope="session")
def sifs(tmp_path_factory) -> Dict[str, Path]:
    """{"good": host-arch SIF with provenance labels, "other": a second one, "wrong_arch":
    a SIF for another architecture, "not_sif": random bytes named .sif}."""
    base = tmp_path_factory.mktemp("sifs")
    here = host_arch()
    other = "arm64" if here != "arm64" else "amd64"
    out = {
        "good": make_sif(base / "tiny-mpi.sif", arch=here, payload=os.urandom(300_000), labels=LABELS),
        "other": make_sif(base / "other.sif", arch=here, payload=os.urandom(50_000)),
        "wrong_arch": make_sif(base / "foreign.sif", arch=other, payload=os.urandom(20_000)),
    }
    (base / "junk.sif").write_bytes(os.urandom(10_000))
    out["not_sif"] = base / "junk.sif"
    return out


def sha256_file(path: Path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def reports(tmp_path: Path) -> Dict[str, Path]:
    """A verification report directory (verify.json, report.md; verdict "good") written by
    dedal.stages.verify.report, and a CycloneDX SBOM."""
    from dedal.stages.verify.report import VerifyReport, write_report

    d = tmp_path / "reports" / "tiny-mpi"
    d.mkdir(parents=True)
    write_report(VerifyReport(image="tiny-mpi.sif", verdict="good"), d)  # what `dedal verify` writes
    sbom = tmp_path / "sbom.cdx.json"
    sbom.write_text(json.dumps({"bomFormat": "CycloneDX", "specVersion": "1.5", "components": []}))
    return {"dir": d, "verify": d / "verify.json", "report": d / "report.md", "sbom": sbom}


Run = Callable[..., subprocess.CompletedProcess]
