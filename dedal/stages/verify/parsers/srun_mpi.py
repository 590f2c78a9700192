"""``srun --mpi=list``: the MPI plugins of a Slurm installation (Slurm 20 to 24).

Slurm 22 and later::

    MPI plugin types are...
    <TAB>none
    <TAB>pmi2
    <TAB>pmix
    specific pmix plugin versions available: pmix_v4,pmix_v5

Slurm 20/21 prefix every line with ``srun: `` and list the versions as plugins
(``srun: pmix_v3``); older Slurm (2.x) names them by plugin type (``srun: mpi/pmi2``), the
``mpi/`` is dropped here. The image's Open MPI 5 is launched with ``srun --mpi=pmix``: a list
without ``pmix`` is judged by the rules (``pmix-missing``, :mod:`dedal.stages.verify.rules`).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

from dedal.stages.verify import findings as F
from dedal.stages.verify.findings import Finding

HEADER = re.compile(r"^(?:srun:\s*)?MPI (?:plugin )?types are\.*", re.IGNORECASE)
VERSIONS = re.compile(r"specific pmix plugin versions? available:\s*(?P<v>.*)$", re.IGNORECASE)
NAME = re.compile(r"^(?:srun:\s*)?(?:mpi/)?(?P<name>[A-Za-z][\w.\-]*)$")


def parse(lines: List[str]) -> Dict[str, Any]:
    findings: List[Finding] = []
    plugins: List[str] = []
    versions: List[str] = []
    in_list = False
    header = ""
    evidence: List[str] = []
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        mh = HEADER.match(line)
        if mh:
            in_list = True
            header = line
            rest = line[mh.end() :]  # a list pasted on one line: "srun: MPI types are... srun: none srun: pmix"
            for name in re.findall(r"srun:\s*(?:mpi/)?([A-Za-z][\w.\-]*)", rest) or rest.split():
                if re.match(r"^[A-Za-z][\w.\-]*$", name) and name not in plugins:
                    plugins.append(name)
                    if re.match(r"^pmix_v\d+", name) and name not in versions:
                        versions.append(name)
            continue
        m = VERSIONS.search(line)
        if m:
            for v in re.split(r"[,\s]+", m.group("v").strip()):
                if v and v not in versions:
                    versions.append(v)
            evidence.append(line)
            in_list = False
            continue
        if in_list:
            m = NAME.match(line)
            if m and not line.startswith("$"):
                name = m.group("name")
                if name not in plugins:
                    plugins.append(name)
                if re.match(r"^pmix_v\d+", name) and name not in versions:
                    versions.append(name)
                continue
            in_list = False
    has_pmix = "pmix" in plugins or any(p.startswith("pmix") for p in plugins)
    recognized = bool(header or versions)
    if recognized:
        if has_pmix:
            findings.append(
                F.info(
                    "pmix-available",
                    f"Slurm MPI plugins: {', '.join(plugins)}"
                    + (f"; PMIx versions: {', '.join(versions)}" if versions else ""),
                    [header] + evidence,
                )
            )
    return {
        "plugins": plugins,
        "pmix_versions": versions,
        "has_pmix": has_pmix,
        "list_lines": ([header] + [ln.strip() for ln in lines if ln.strip() and ln.strip() != header][:6])
        if header
        else [],
        "_findings": findings,
        "_base_verdict": "good" if plugins else "unknown",
        "_recognized": recognized,
    }
