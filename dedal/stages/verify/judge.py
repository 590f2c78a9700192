"""The one judge of verification: the rules table (:mod:`dedal.stages.verify.rules`) applied to
the facts of a log and the host it ran on (issue 38; ReFrame's "declare, judge once").

Of the rows a fact matches, the most specific one (most host conditions, then a ``match``) gives
the finding; of equal specificity the last (a site's over dedal's). A context row (code ``*``)
re-grades the findings whose row ``means`` the same in its scope and host conditions.

:func:`judge` applies the table to the facts of one log (and the host, when known);
:func:`graded` is the context row the preflight reads for the host's network; :func:`codes_of`
the codes of one hardware class's measured rows.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from dedal.stages.verify.facts import FACTS, Fact, HostFacts, Seen
from dedal.stages.verify.findings import Finding
from dedal.stages.verify.rules import RULES, Rule


def host_view(host: Optional[HostFacts], seen: Sequence[Seen] = ()) -> Dict[str, Any]:
    """The host conditions rows test: what the preflight found (``host``; None: nothing known) and,
    for the fabric, what the log itself names (an RDMA device, a Slingshot or IPoIB interface)."""
    in_log = any(s.key == "net:fabric" for s in seen)
    if host is None:
        return {"fabric": True if in_log else None, "multi_node": None, "gpus": None, "gpu_p2p": None, "gdrdma": None}
    return {
        "fabric": bool(host.has_infiniband or in_log),
        "multi_node": bool(host.multi_node),
        "gpus": bool(host.gpus),
        "gpu_p2p": host.gpu_p2p,
        "gdrdma": host.gdrdma,
    }


def _host_ok(row: Rule, view: Mapping[str, Any]) -> bool:
    return all(view.get(k) is v or view.get(k) == v for k, v in row.host)


def _scope_ok(want: str, scope: Optional[str]) -> bool:
    return not want or scope is None or want == scope


def _pick(candidates: Sequence[Rule]) -> Optional[Rule]:
    """The most specific row; of equal specificity the last one (a site's over dedal's)."""
    best: Optional[Rule] = None
    for r in candidates:
        if best is None or r.specificity >= best.specificity:
            best = r
    return best


def _context(f: Finding, row: Rule, scope: Optional[str], view: Mapping[str, Any], rows: Sequence[Rule]) -> Finding:
    if not row.means:
        return f
    ctx = _pick(
        [
            c
            for c in rows
            if c.context and c.means == row.means and scope is not None and c.scope in ("", scope) and _host_ok(c, view)
        ]
    )
    if ctx is None:
        return f
    return Finding(ctx.severity, f.code, ctx.message.format(message=f.message), f.evidence, ctx.verdict)


def _judge_seen(
    seen: Sequence[Seen], present: set, view: Mapping[str, Any], scope: Optional[str], rows: Sequence[Rule]
) -> List[Finding]:
    out: List[Finding] = []
    for s in seen:
        fit = [
            r
            for r in rows
            if not r.context
            and not r.measured
            and r.key == s.key
            and r.scope in ("", s.scope)
            and _host_ok(r, view)
            and not any(u in present for u in r.unless)
            and (not r.match or any(re.search(r.match, i) for i in s.items))
        ]
        row = _pick(fit)
        if row is None:
            continue
        msg = row.message.format(items=", ".join(s.items) or "none", scope=s.scope, detail=s.detail)
        where = s.scope if s.scope != "unknown" else (scope if s.nic and scope else s.scope)
        out.append(
            _context(Finding(row.severity, row.code, msg, list(s.evidence), row.verdict), row, where, view, rows)
        )
    return out


def _best(facts: Sequence[Fact]) -> Fact:
    better = FACTS[facts[0].key][1]
    return (min if better == "lower" else max)(facts, key=lambda f: f.value)


def _judge_measured(
    facts: Sequence[Fact],
    present: set,
    view: Mapping[str, Any],
    scope: Optional[str],
    hardware: Optional[Sequence[str]],
    rows: Sequence[Rule],
) -> List[Finding]:
    by_key: Dict[str, List[Fact]] = {}
    for f in facts:
        by_key.setdefault(f.key, []).append(f)
    out: List[Finding] = []
    for row in rows:
        if row.context or not row.measured or (hardware is not None and row.hardware not in hardware):
            continue
        if row.scope and scope is not None and scope != row.scope:
            continue
        if not _host_ok(row, view) or any(u in present for u in row.unless):
            continue
        ref: Optional[Fact] = None
        if row.of:
            if not by_key.get(row.of):
                continue
            ref = _best(by_key[row.of])
        scale = ref.value if ref is not None else 1.0
        for f in by_key.get(row.key, []):
            if row.at_least is not None and not f.value >= row.at_least * scale:
                continue
            if row.below is not None and not f.value < row.below * scale:
                continue
            limit = (row.at_least if row.at_least is not None else row.below or 0.0) * scale
            values = {"subject": f.subject, "value": f.value, "unit": f.unit, "limit": limit}
            if ref is not None:
                values.update(ref=ref.subject, ref_value=ref.value, ratio=f.value / ref.value if ref.value else 0.0)
            evidence = list(f.evidence) + (list(ref.evidence) if ref is not None else [])
            found = Finding(row.severity, row.code, row.message.format(**values), evidence, row.verdict)
            out.append(_context(found, row, scope, view, rows))
    return out


def judge(
    seen: Iterable[Seen] = (),
    facts: Iterable[Fact] = (),
    *,
    host: Optional[HostFacts] = None,
    scope: Optional[str] = None,
    hardware: Optional[Sequence[str]] = None,
    rows: Sequence[Rule] = RULES,
) -> List[Finding]:
    """Every row of ``rows`` applied once: a finding per seen fact that a row matches (the most
    specific one), then per measured fact in a row's range (rows in table order), each quoting the
    fact's lines and re-graded by the context rows. ``host``: what the preflight found (None: a
    log judged alone, ``dedal verify parse``); ``scope``: where the log ran (None: unknown);
    ``hardware``: judge only the measured rows of these classes (seen facts are judged whatever)."""
    seen = list(seen)
    facts = list(facts)
    present = {s.key for s in seen} | {f.key for f in facts}
    view = host_view(host, seen)
    return (_judge_seen(seen, present, view, scope, rows) if hardware is None else []) + _judge_measured(
        facts, present, view, scope, hardware, rows
    )


def graded(means: str, scope: str, host: Optional[HostFacts], rows: Sequence[Rule] = RULES) -> Optional[Rule]:
    """The context row that re-grades a finding that ``means`` this in ``scope`` on ``host`` (None:
    the findings keep their own severity): what the preflight says of the host's network."""
    view = host_view(host)
    return _pick([c for c in rows if c.context and c.means == means and c.scope in ("", scope) and _host_ok(c, view)])


def codes_of(hardware: str, rows: Sequence[Rule] = RULES) -> frozenset:
    """The finding codes of the measured rows of one hardware class."""
    return frozenset(r.code for r in rows if r.measured and r.hardware == hardware)
