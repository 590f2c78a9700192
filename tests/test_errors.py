"""dedal.errors: how a stop by a signal is said and what exit code it gives; which signals
a ``Signals`` block takes. Real signals to this process."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dedal.errors import Interrupted, Signals


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_exits_as_a_shell_reports_that_signal(signum, code) -> None:
    stop = Interrupted.by(signum, "verify")
    assert stop.exit_code == code
    assert stop.one_line() == f"verify interrupted by signal {signal.Signals(signum).name}"


def test_a_signal_raises_the_stop_of_that_signal() -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, whatever ran this suite (nohup)
    try:
        with pytest.raises(Interrupted) as caught:
            with Signals("test"):
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(5)
    finally:
        signal.signal(signal.SIGHUP, before)
    assert caught.value.signal_name == "SIGHUP" and caught.value.exit_code == 129


def test_a_signal_ignored_by_whoever_started_dedal_stays_ignored() -> None:
    """``nohup dedal build-image … &`` on a login node: nohup ignores SIGHUP so that the build
    outlives the session. Before, a ``Signals`` block (assembly, verification, the base)
    took SIGHUP back and stopped the build when the user logged out."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with Signals("test") as guard:
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.2)
        assert guard.received == "" and signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
