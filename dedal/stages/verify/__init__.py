"""Verification of an image: parse benchmark outputs and debug logs, compare native vs
container measurements, check the transports, write the report.

- :mod:`dedal.stages.verify.parsers`: ``parse_text`` / ``parse_file`` for OSU, nccl-tests, NCCL,
  UCX, Open MPI and Slurm outputs, with failure signatures detected in any log;
- :mod:`dedal.stages.verify.findings`: the ``Finding`` record and the verdict ordering;
- :mod:`dedal.stages.verify.facts`: what a log or a table shows, without a judgement (``Seen``: a
  stack's transports/protocols/plugins per scope with their lines; ``Fact``: a measured number;
  ``HostFacts``: what the preflight found);
- :mod:`dedal.stages.verify.rules`: the one rules table (code, when: host facts + scope + facts,
  severity, message; a site adds or overrides rows); :mod:`dedal.stages.verify.judge`: the one
  judge that applies it;
- :mod:`dedal.stages.verify.image`: the image under verification (labels, target, benchmarks);
  :mod:`dedal.stages.verify.native`: its native twin (the host's stack, or the image unpacked);
- :mod:`dedal.stages.verify.checks`: native vs container measurements against thresholds (pure functions);
- :mod:`dedal.stages.verify.expectations`: what each measurement should be on its hardware class (host
  buffers, GPU buffers), declared as rows and judged once, against class bounds and the same host's
  references (host-buffer latency, the CUDA floor of ``dedal_cuda_floor``);
- :mod:`dedal.stages.verify.transports`: the judge over the runtime's logs of a report, against the host;
- :mod:`dedal.stages.verify.apps`: the environment file's application checks (in the container: exit 0, the
  expected output); :mod:`dedal.stages.verify.appbench`: its application benchmarks (an app with a metric:
  native vs container, interleaved, every run's correctness checked, the medians compared by ``checks``);
- :mod:`dedal.stages.verify.report`: ``verify.json``, ``report.md`` and PNG plots (read back
  through :mod:`dedal.model.verify_report`);
- :mod:`dedal.stages.verify.options` and :mod:`dedal.stages.verify.runner`: the checked options
  and :func:`verify` (options in, :class:`Outcome` out); the command line is
  :mod:`dedal.commands.verify`'s.

This face is what other packages import. The verdict rules load with it; the runner, the
parsers and the report (MPI, runtimes, Slurm: about half a second) load on first use of one
of their names, so that ``dedal publish`` or a gate does not pay for them.
"""

from __future__ import annotations

import importlib
from typing import Any

from dedal.stages.verify.checks import skipped_of, skipped_text
from dedal.stages.verify.findings import VERDICTS, GATES, Finding, gate_allows, gate_refusal, verdict_with, worst

# name -> module that defines it, imported on first use (PEP 562)
_LAZY = {
    "Options": "options",
    "options_from_args": "options",
    "Given": "options",
    "verify_options": "options",
    "site_rule_table": "options",
    "DEFAULT_MAX_SIZE": "options",
    "DEFAULT_NCCL_MAX": "options",
    "DEFAULT_TIMEOUT": "options",
    "Outcome": "runner",
    "verify": "runner",
    "KINDS": "parsers",
    "parse_file": "parsers",
    "parse_text": "parsers",
    "VerifyReport": "report",
    "console_lines": "report",
    "CATALOGUE": "catalogue",
    "host_busy": "load",
    "KEYS": "catalogue",
}

__all__ = [
    "VERDICTS",
    "GATES",
    "Finding",
    "worst",
    "gate_allows",
    "gate_refusal",
    "verdict_with",
    "skipped_of",
    "skipped_text",
    *sorted(_LAZY),
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
