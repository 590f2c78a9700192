"""`dedal images` against a registry that takes the connection and never answers (issue 35):
on a terminal it says what it waits for while it waits, and the error names the host well
before the old 92 s; with --json nothing but the error, and nothing on stdout."""

from __future__ import annotations

import re

import pytest

from dedal.adapters.registry import transport
from tests.conftest import dedal_exe
from tests.fixtures.terminal import in_terminal

pytestmark = pytest.mark.reliability

# the first contact: GET /v2/ over https, then plain http (a local registry), each answered
# within ANSWER_TIMEOUT or given up; the connection and the TLS handshake within CONNECT_TIMEOUT
BOUND_S = 2 * max(transport.CONNECT_TIMEOUT, transport.ANSWER_TIMEOUT)


def test_a_mute_registry_is_shown_while_waited_for_and_named_in_the_error(silent_server, isolated_env, tmp_path):
    env = dict(isolated_env, CI="")  # a person's terminal, not a CI job's log
    term = in_terminal([dedal_exe(), "images", f"oras://{silent_server.host}/esd/tiny"], env, timeout=120, cwd=tmp_path)
    assert term.rc == 1, term.text
    assert f"dedal: error: registry {silent_server.host} unreachable over https (no answer in" in term.text
    assert len(silent_server.accepted) == 2, "one first contact per scheme, no retries (5 x 60 s before)"
    waiting = re.findall(rf"waiting for {re.escape(silent_server.host)}  (\d+) s", term.text)
    assert waiting and int(waiting[-1]) >= BOUND_S - 2, term.text[-2000:]  # the time, counted up while it waits
    assert "GET https://" in term.text and "GET http://" in term.text  # what it waits for
    assert term.longest_silence() < transport.WAITING_SHOWN_AFTER + 5, "no silent wait"


def test_with_json_only_the_error_and_nothing_on_stdout(silent_server, run_dedal):
    r = run_dedal("images", f"oras://{silent_server.host}/esd/tiny", "--json", timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        f"dedal: error: registry {silent_server.host} unreachable over https "
        f"(no answer in {transport.ANSWER_TIMEOUT:.0f} s) and http "
        f"(no answer in {transport.ANSWER_TIMEOUT:.0f} s)"
    ]
