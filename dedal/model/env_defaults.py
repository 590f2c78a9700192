"""The defaults of the environment file, read from its schema
(``dedal/data/schema/env.schema.json``): the one place they are written. A module of its own,
light (no YAML, no base definitions), for the code that needs a default without reading an
environment file (the plan's tag, the verification's ranks)."""

from __future__ import annotations

from typing import Any, Dict

from dedal.model.schema import Validator, load_schema

ENV_SCHEMA: Dict[str, Any] = load_schema("env")
ENV_VALIDATOR = Validator(ENV_SCHEMA)

DEDAL: Dict[str, Any] = ENV_VALIDATOR.defaults("dedal")
VERIFY: Dict[str, Any] = ENV_VALIDATOR.defaults("dedal", "verify")
APP: Dict[str, Any] = ENV_VALIDATOR.defaults("#", "app")
METRIC: Dict[str, Any] = ENV_VALIDATOR.defaults("#", "metric")

DEFAULT_TAG: str = DEDAL["tag"]
DEFAULT_RANKS: int = VERIFY["ranks"]
DEFAULT_NODES: int = VERIFY["nodes"]
DEFAULT_REPETITIONS: int = VERIFY["repetitions"]
DEFAULT_LAUNCHER: str = VERIFY["launcher"]
#: the container may be this much slower (or, higher better, lose this much) than native: an
#: application's time to solution varies more between runs than a microbenchmark's
DEFAULT_APP_OVERHEAD_PCT: float = METRIC["overhead_pct"]
