"""Fixtures of the verify tests: where the recorded logs lie, and a parse helper."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import LOGS_DATA

#: logs recorded on this project's own test machine (Open MPI 5.0.7 + UCX 1.18.1 in a Debian trixie root)
LOCAL_DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def logs() -> Path:
    if not LOGS_DATA.is_dir():
        pytest.skip(f"shared log data not found at {LOGS_DATA}")
    return LOGS_DATA


@pytest.fixture
def local_data() -> Path:
    return LOCAL_DATA
