"""The registry transport: dedal's requests under oras-py's ``Registry``, for one host.

oras-py supplies blob existence checks, chunked uploads, paginated tag lists, blob
downloads and URL building; ``Transport.do_request`` underneath them (and under every
request of :class:`~dedal.adapters.registry.client.RegistryClient`) adds

* authentication through ``RegistryAuth``, answered only when the registry asks;
* retries with exponential backoff and jitter on 5xx/429 answers and broken
  connections (a body read from a file is rewound before every attempt), bounded three
  ways: ``retries`` per request, ``2 * retries`` for the whole client, and its
  ``deadline``: the seconds one operation (a publish, a pull, one layer of a cache) may
  go without progress, retries and waits included (every byte of a blob sent or
  received, every GET answered and every PUT stored starts it again, so a long transfer
  that moves is never cut, and a stalled one ends after ``deadline``, not after attempts
  x timeout: answers that move nothing, a HEAD, an upload session, an error, do not count); a stall of one attempt is a
  read ``timeout`` (no byte for that long); a ``Retry-After`` longer than
  ``MAX_RETRY_AFTER`` ends the operation at once instead of being waited out; each
  kind of failure is one warning line, however often it repeats;
* a registry that accepts connections but never answers is told at first contact:
  ``GET /v2/`` may wait ``ANSWER_TIMEOUT`` for its answer on each scheme it tries (the
  stall ``timeout`` applies after that, where a big upload may be slow to be answered);
  a request still waiting after ``WAITING_SHOWN_AFTER`` shows ``waiting for HOST (12 s)``
  (:mod:`dedal.ui.activity`); an upload that stops moving for that long shows ``upload to
  HOST stalled`` with the seconds left before it gives up (:mod:`.stall`);
* ``https`` with certificate verification unless ``insecure`` is asked for, in which
  case unverified https is tried first and plain http second; for a registry on this
  machine or a private network (:func:`dedal.model.oci.local_registry`) plain http is the fallback
  without asking, as Apptainer (go-containerregistry) does: ``apptainer pull
  oras://127.0.0.1:5000/...`` works without ``--no-https``, and so does dedal;
* every answer read whole (a manifest, an index, a tag list, an error) at most
  ``ANSWER_LIMIT`` bytes, a small blob ``get_blob_bytes``'s limit: a registry is input,
  and a larger answer is refused (``TooLarge``, exit 2) before it is in memory.

Errors name the registry, the method and the path, never credentials.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import IO, Any, Callable, Dict, Optional, Tuple, Union

import oras.provider
import requests
import requests.exceptions

from dedal.adapters.registry.auth import Credentials, RegistryAuth
from dedal.adapters.registry.errors import (
    ANSWER_LIMIT,
    TRANSIENT_ERRORS,
    NotFound,
    RegistryAuthError,
    error_body,
    read_body,
    redact_url,
    short_reason,
    transport_failure,
)
from dedal.adapters.registry.stall import Stall, stall
from dedal.model.oci import RegistryError, local_registry
from dedal.ui.activity import Activity, activity

log = logging.getLogger("dedal.registry")

RETRY_STATUS = (429, 500, 502, 503, 504)
MAX_RETRY_AFTER = 60.0  # seconds a Retry-After may ask for; longer: give up now, with the reason
MAX_BACKOFF = 30.0
CONNECT_TIMEOUT = 10.0  # seconds to connect: TCP and the TLS handshake (urllib3 bounds both by it)
ANSWER_TIMEOUT = 10.0  # seconds the first contact (GET /v2/, per scheme) waits for an answer
WAITING_SHOWN_AFTER = 5.0  # a request unanswered (an upload stalled) this long is shown: "waiting for HOST (12 s)"
DEADLINE = 180.0  # seconds an operation may go without progress (setting registry_deadline_s)
TIMEOUT = 60.0  # seconds one request may wait for an answer (setting registry_timeout_s)
RETRIES = 4  # attempts after the first, for a transient failure
BACKOFF = 0.5  # seconds before the first retry, doubled for each next
CHUNK = 1 << 20


class Transport(oras.provider.Registry):
    """One registry host (``host[:port]``): oras-py's Registry with dedal's transport underneath
    (:class:`~dedal.adapters.registry.client.RegistryClient` adds the requests dedal makes).

    ``retries``: extra attempts after a transient failure; ``backoff``: first delay in
    seconds, doubled each time (with jitter), at most MAX_BACKOFF. ``insecure``: unverified
    https, then plain http. ``timeout``: seconds without a byte (a response to start, the
    next part of a body) before the attempt counts as failed. ``deadline``: seconds
    without progress (no byte sent or received, no answer) after which no request is
    started or retried, and to which every attempt's timeouts are cut.
    """

    def __init__(
        self,
        host: str,
        *,
        creds: Optional[Credentials] = None,
        insecure: bool = False,
        retries: int = RETRIES,
        backoff: float = BACKOFF,
        timeout: float = TIMEOUT,
        deadline: float = DEADLINE,
        session: Optional[requests.Session] = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(hostname=host, insecure=insecure, tls_verify=not insecure)
        if session is not None:
            self.session = session
        self.host = host
        self.insecure = insecure
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.timeout = float(timeout)
        self.deadline = float(deadline)
        self._ends = time.monotonic() + self.deadline
        self._warned: set = set()
        self._sleep = sleep
        self._auth = RegistryAuth(host, creds)
        self._scheme: Optional[str] = None
        self._stall: Optional[Stall] = None
        self.stats: Dict[str, int] = {
            "requests": 0,
            "retries": 0,
            "blobs_uploaded": 0,
            "blobs_skipped": 0,
            "bytes_uploaded": 0,
        }

    @property
    def base(self) -> str:
        """``scheme://host``, found on first use (https; with insecure, http if TLS fails)."""
        if self._scheme is None:
            self._scheme = self._probe_scheme()
            self.prefix = self._scheme  # oras-py builds its URLs with self.prefix
            self.auth.prefix = self._scheme
        return f"{self._scheme}://{self.host}"

    def _probe_scheme(self) -> str:
        with activity(f"waiting for {self.host}", after=WAITING_SHOWN_AFTER) as shown:
            return self._probe(shown)

    def _probe(self, shown: Activity) -> str:
        url = f"https://{self.host}/v2/"
        timeouts = self._timeouts(f"GET {url}", first=True)
        shown.step(f"GET {url}")
        try:
            self.session.get(url, verify=not self.insecure, timeout=timeouts, stream=True).close()  # body unread
            return "https"
        except requests.exceptions.SSLError as exc:
            if self.insecure or local_registry(self.host):
                log.debug(
                    "TLS to %s failed, using plain http (%s)",
                    self.host,
                    "--insecure" if self.insecure else "a local registry",
                )
                return "http"
            raise RegistryError(
                f"registry {self.host}: TLS connection failed ({short_reason(exc)}); if it serves "
                "plain HTTP or has a certificate you do not trust, pass --insecure "
                "(setting registry_insecure)"
            ) from None
        except TRANSIENT_ERRORS as exc:
            if self.insecure or local_registry(self.host):
                return self._plain_http_answers(transport_failure(exc, timeouts), shown)
            raise RegistryError(
                f"registry {self.host} unreachable over https ({transport_failure(exc, timeouts)}); if it "
                "serves plain HTTP, pass --insecure (setting registry_insecure)"
            ) from None

    def _plain_http_answers(self, https_failure: str, shown: Activity) -> str:
        """``http`` where the registry (a local one, or any with --insecure) answers over
        plain HTTP after https could not connect or was not answered; otherwise one error
        at once (as Apptainer, which tries both), not retries of a registry that is not
        there or does not answer."""
        url = f"http://{self.host}/v2/"
        timeouts = self._timeouts(f"GET {url}", first=True)
        shown.step(f"GET {url} (https: {https_failure})")
        try:
            self.session.get(url, timeout=timeouts, stream=True).close()  # body unread
            return "http"
        except TRANSIENT_ERRORS as exc:
            raise RegistryError(
                f"registry {self.host} unreachable over https ({https_failure}) "
                f"and http ({transport_failure(exc, timeouts)})"
            ) from None

    def url(self, path: str) -> str:
        return f"{self.base}{path}"

    def begin(self) -> None:
        """Start a new operation on a client kept for several (a layer cache's pulls, then
        its pushes hours later): a fresh deadline and retry budget."""
        self._ends = time.monotonic() + self.deadline
        self.stats["retries"] = 0
        self._warned.clear()

    def remaining(self) -> float:
        """Seconds left of this client's deadline."""
        return self._ends - time.monotonic()

    def progressed(self, n: int = 0, *, new: bool = True) -> None:
        """Bytes were sent or received (``n``), or data was answered or stored: the deadline
        starts again, unless the bytes are not ``new`` (sent again by a retry: a registry
        that stalls every upload at one point makes no progress); the display's stall
        clock starts again either way."""
        if new:
            self._ends = time.monotonic() + self.deadline
        if n and self._stall is not None:
            self._stall.progressed(n)

    def _timeouts(self, what: str, first: bool = False, sending: bool = False) -> Tuple[float, float]:
        """(connect, read) timeouts of the next attempt, within the deadline; ``first``:
        of the first contact, whose answer is due within ANSWER_TIMEOUT; ``sending``: of
        a request that sends a file, which may stall as long as an answer may (urllib3
        bounds sending the body by the connect timeout)."""
        left = self.remaining()
        if left <= 0:
            raise RegistryError(
                f"{what}: gave up: no progress within the registry operation's deadline of "
                f"{self.deadline:.0f} s (setting registry_deadline_s; {self.stats['requests']} "
                f"request(s), {self.stats['retries']} retries)"
            )
        read = min(ANSWER_TIMEOUT, self.timeout, left) if first else min(self.timeout, left)
        return (read if sending else min(CONNECT_TIMEOUT, self.timeout, left)), read

    def do_request(  # type: ignore[override]
        self,
        url: str,
        method: str = "GET",
        data: Optional[Union[dict, bytes, IO[bytes]]] = None,
        headers: Optional[dict] = None,
        json: Optional[dict] = None,
        stream: bool = False,
        *,
        retry: bool = True,
        ok: Tuple[int, ...] = (),
    ) -> requests.Response:
        """One request with auth and retries; used by oras-py's methods as well.

        Transient failures (5xx, 429, broken connections) are retried up to
        ``self.retries`` times with backoff when ``retry``; the last one raises
        RegistryError. Other statuses are returned, or raised unless in ``ok`` when
        ``ok`` is given. While it waits longer than WAITING_SHOWN_AFTER for an answer (or
        between retries), ``waiting for HOST`` is shown; while a file is sent, its byte
        count is on the display, and ``upload to HOST stalled`` once no byte has gone
        (or no answer come) for that long (:mod:`.stall`).
        """
        if url.startswith("/"):
            url = self.url(url)
        elif not self._scheme:
            _ = self.base
        if hasattr(data, "read"):
            with stall(
                f"upload to {self.host} stalled",
                f"{method} {redact_url(url)}",
                self.remaining,
                size=len(data) if hasattr(data, "__len__") else 0,  # type: ignore[arg-type]
                after=WAITING_SHOWN_AFTER,
            ) as shown:
                self._stall = shown
                try:
                    return self._attempts(shown, url, method, data, headers, json, stream, retry, ok)
                finally:
                    self._stall = None
        with activity(f"waiting for {self.host}", after=WAITING_SHOWN_AFTER) as shown:
            return self._attempts(shown, url, method, data, headers, json, stream, retry, ok)

    def _attempts(
        self,
        shown: Activity,
        url: str,
        method: str,
        data: Any,
        headers: Optional[dict],
        json: Optional[dict],
        stream: bool,
        retry: bool,
        ok: Tuple[int, ...],
    ) -> requests.Response:
        attempts = 1 + (self.retries if retry else 0)
        auth_rounds = 0
        attempt = 0
        while True:
            if not isinstance(shown, Stall):
                shown.step(
                    f"{method} {redact_url(url)}" + (f", attempt {attempt + 1} of {attempts}" if attempt else "")
                )
            hdrs = dict(headers or {})
            hdrs.update(self._auth.header())
            if hasattr(data, "seek"):
                data.seek(0)  # type: ignore[union-attr]
            timeouts = self._timeouts(f"{method} {redact_url(url)}", sending=hasattr(data, "read"))
            self.stats["requests"] += 1
            try:
                # always streamed: an answer read whole is read here, bounded (ANSWER_LIMIT)
                response = self.session.request(
                    method,
                    url,
                    data=data,
                    json=json,
                    headers=hdrs,
                    stream=True,
                    verify=not self.insecure,
                    timeout=timeouts,
                    allow_redirects=True,
                )
                if method == "HEAD":  # no body (http.client reads none), whatever its Content-Length says
                    response._content = b"".join(response.iter_content(CHUNK))  # and the connection kept
                elif response.status_code >= 300:
                    response._content = error_body(response)
                elif not stream:
                    # what requests does for stream=False, bounded (.content, .json() read it)
                    response._content = read_body(response, ANSWER_LIMIT, f"the answer to {method} {redact_url(url)}")
            except requests.exceptions.SSLError as exc:
                raise RegistryError(
                    f"{method} {redact_url(url)}: TLS error ({short_reason(exc)}); pass --insecure "
                    "only if you trust this registry"
                ) from None
            except TRANSIENT_ERRORS as exc:
                attempt += 1
                if attempt >= attempts:
                    raise RegistryError(
                        f"{method} {redact_url(url)}: connection failed after {attempt} "
                        f"attempt(s) ({transport_failure(exc, timeouts)})"
                    ) from None
                self.wait_before_retry(
                    attempt, f"{method} {redact_url(url)}: {transport_failure(exc, timeouts)}", kind=type(exc).__name__
                )
                continue
            if response.status_code == 401 and auth_rounds < 3:
                self._auth.answer(response, self.session, not self.insecure, already_sent="Authorization" in hdrs)
                auth_rounds += 1
                response.close()
                continue
            if response.status_code in RETRY_STATUS and retry:
                attempt += 1
                if attempt < attempts:
                    delay = _retry_after(response)
                    response.close()
                    why = f"{method} {redact_url(url)}: HTTP {response.status_code}"
                    if delay is not None and delay > MAX_RETRY_AFTER:
                        raise RegistryError(
                            f"{why}: the registry asks to retry after {delay:.0f} s (Retry-After); "
                            "giving up now, try again later"
                        )
                    self.wait_before_retry(attempt, why, delay, kind=f"HTTP {response.status_code}")
                    continue
            if response.status_code < 300 and method in ("GET", "PUT", "PATCH"):
                self.progressed()  # data came or was stored (not a HEAD, an upload session, an error)
            if ok and response.status_code not in ok:
                raise self.error(response, method, url)
            return response

    def wait_before_retry(self, attempt: int, why: str, delay: Optional[float] = None, kind: str = "") -> None:
        """Sleep before retry ``attempt`` (backoff with jitter, or the registry's
        Retry-After); RegistryError instead when the client's retries or its deadline are
        spent. The first failure of each ``kind`` is a warning, the rest debug lines."""
        if self.stats["retries"] >= 2 * self.retries:
            raise RegistryError(f"{why}: gave up after {self.stats['retries']} retries of this registry operation")
        if delay is None:
            ceiling = min(MAX_BACKOFF, self.backoff * (2 ** (attempt - 1)))
            delay = ceiling / 2 + random.uniform(0, ceiling / 2)
        if delay >= self.remaining():
            raise RegistryError(
                f"{why}: gave up: the registry operation's deadline of {self.deadline:.0f} s without "
                f"progress (setting registry_deadline_s) leaves no time for retry {attempt}"
            )
        self.stats["retries"] += 1
        kind = kind or why
        level = logging.DEBUG if kind in self._warned else logging.WARNING
        self._warned.add(kind)
        log.log(
            level,
            "registry %s: %s; retry %d/%d in %.1f s%s",
            self.host,
            why,
            attempt,
            self.retries,
            delay,
            "" if level == logging.DEBUG else " (further failures of this kind are not shown)",
        )
        self._sleep(delay)

    def error(self, response: requests.Response, method: str, url: str) -> RegistryError:
        """A RegistryError naming the request, the status and the registry's error codes."""
        detail = ""
        try:
            body = json.loads(response.content)
            errs = body.get("errors") if isinstance(body, dict) else None
            if errs:
                detail = "; ".join(
                    f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errs if isinstance(e, dict)
                )
        except ValueError:
            pass  # no error codes to show: the status says it
        msg = f"{method} {redact_url(url)}: HTTP {response.status_code} {response.reason or ''}".rstrip()
        if detail:
            msg += f" ({detail})"
        if response.status_code == 404:
            return NotFound(msg)
        if response.status_code in (401, 403):
            return RegistryAuthError(msg + "; check the credentials and your access to this repository")
        return RegistryError(msg)

    def _check_200_response(self, response: requests.Response) -> None:  # oras-py hook
        if response.status_code not in (200, 201, 202):
            raise self.error(response, response.request.method or "", response.request.url or "")


def _retry_after(response: requests.Response) -> Optional[float]:
    value = response.headers.get("Retry-After", "")
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None  # an HTTP date: backoff as usual
