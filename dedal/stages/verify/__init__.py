"""Verification of an image: parse benchmark outputs and debug logs, compare native vs
container measurements, check the transports, write the report.

- :mod:`dedal.stages.verify.parsers`: ``parse_text`` / ``parse_file`` for OSU, nccl-tests, NCCL,
  UCX, Open MPI and Slurm outputs, with failure signatures detected in any log;
- :mod:`dedal.stages.verify.findings`: the ``Finding`` record and the verdict ordering;
- :mod:`dedal.stages.verify.facts`: what a log or a table shows, without a judgement (``Seen``: a
  stack's transports/protocols/plugins per scope with their lines; ``Fact``: a measured number;
  ``HostFacts``: what the preflight found);
- :mod:`dedal.stages.verify.rules`: the one rules table (code, when: host facts + scope + facts,
  severity, message; a site adds or overrides rows) and the one judge that applies it;
- :mod:`dedal.stages.verify.checks`: native vs container measurements against thresholds (pure functions);
- :mod:`dedal.stages.verify.expectations`: what each measurement should be on its hardware class (host
  buffers, GPU buffers), declared as rows and judged once, against class bounds and the same host's
  references (host-buffer latency, the CUDA floor of ``dedal_cuda_floor``);
- :mod:`dedal.stages.verify.transports`: the judge over the runtime's logs of a report, against the host;
- :mod:`dedal.stages.verify.apps`: the environment file's application checks (in the container: exit 0, the
  expected output); :mod:`dedal.stages.verify.appbench`: its application benchmarks (an app with a metric:
  native vs container, interleaved, every run's correctness checked, the medians compared by ``checks``);
- :mod:`dedal.stages.verify.report`: ``verify.json``, ``report.md`` and PNG plots.
"""
from __future__ import annotations

from dedal.stages.verify.findings import VERDICTS, Finding, worst

__all__ = ["VERDICTS", "Finding", "worst"]
