"""One table of every scaling figure under a results directory (what benchmarks/apps/figures.sh
wrote: ``<app>-<mode>-<runtime>/results.json`` each, from scaling.py): per figure and node count
the native and container medians, container / native, both sides' efficiency against the ideal
and the verdict, so that the container's cost can be read across applications, modes, runtimes
and node counts at once; and the ratios' median and range over all of them.

    .venv/bin/python benchmarks/apps/summary.py [DIR]     (default benchmarks/apps/results)

Writes ``DIR/summary.md`` and prints it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent


def runtime_of(results: Dict[str, Any]) -> str:
    """The container runtime a figure was measured with (its ``--runtime`` verify option)."""
    extra = list(results.get("extra_verify_options") or [])
    if "--runtime" in extra and extra.index("--runtime") + 1 < len(extra):
        return extra[extra.index("--runtime") + 1]
    return "auto"


def _fmt(v: Optional[float], digits: int = 3) -> str:
    return "-" if v is None else f"{v:.{digits}g}"


def summary(figures: List[Dict[str, Any]]) -> str:
    lines = [
        "# Application scaling, native and container: every figure",
        "",
        "Each row: one node count of one figure (`<app>-<mode>-<runtime>/results.md` has its runs, "
        "plot and reports). Efficiency: ideal / value for a time (1: ideal; strong scaling's ideal "
        "shrinks with the nodes, weak scaling's stays the 1-node native value).",
        "",
        "| app | mode | runtime | nodes | ranks | native median | container median | container / native "
        "| efficiency native | efficiency container | load before | verdict |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    ratios = []
    for r in figures:
        for row in r["rows"]:
            unit = r["unit"]
            if row.get("ratio") is not None:
                ratios.append(row["ratio"])
            verdict = row["verdict"] + (f" ({', '.join(row['problems'])})" if row.get("problems") else "")
            lines.append(
                f"| {r['app']} | {r['mode']} | {runtime_of(r)} | {row['nodes']} | {row['ranks']} | "
                f"{_fmt(row.get('native_median'))} {unit} | {_fmt(row.get('container_median'))} {unit} | "
                f"{_fmt(row.get('ratio'))} | {_fmt(row.get('native_efficiency'))} | "
                f"{_fmt(row.get('container_efficiency'))} | {_fmt(row.get('load'), 2)} | {verdict} |"
            )
    if ratios:
        lines += [
            "",
            f"Container / native over all {len(ratios)} rows: median {statistics.median(ratios):.3f}, "
            f"range {min(ratios):.3f}..{max(ratios):.3f}.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0]) if args else HERE / "results"
    figures = [json.loads(p.read_text()) for p in sorted(root.glob("*/results.json"))]
    if not figures:
        print(f"summary.py: no */results.json under {root}", file=sys.stderr)
        return 2
    text = summary(figures)
    (root / "summary.md").write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
