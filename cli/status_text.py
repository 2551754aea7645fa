"""The text of ``gpushare status``: one agent's ``/status`` document (or the API-only stand-in) as
an operator reads it. Plain rendering over a plain dict, so ``kubectl gpushare status NODE`` can
show the same text from any machine without importing the agent that builds the document.
"""

from __future__ import annotations

import time
from typing import Any


def render_text(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    if doc.get("warning"):
        lines.append(f"WARNING: {doc['warning']}")
    nri = doc.get("nri") or {}
    connected = nri.get("connected")
    nri_text = "unknown" if connected is None else ("connected" if connected else "NOT connected")
    lines.append(f"node {doc.get('node') or '?'}  (source: {doc.get('source')})")
    lines.append(f"NRI: {nri_text}" + (f" ({nri.get('socket')})" if nri.get("socket") else ""))
    if doc.get("source") == "agent":
        age = time.time() - float(doc.get("at") or 0)
        lines.append(
            f"loop: leader={doc.get('is_leader')} passes={doc.get('passes')} last pass {age:.1f}s ago"
            + (f"  error: {doc['error']}" if doc.get("error") else "")
        )
    lines.append("")
    lines.append(f"{'RESOURCE':32} {'ADVERTISED':>10} {'ALLOCATED':>10}")
    advertised, allocated = doc.get("advertised") or {}, doc.get("allocated") or {}
    for r in sorted(set(advertised) | set(allocated)):
        if advertised.get(r, 0) or allocated.get(r, 0):
            # "-": a vendor resource gpushare does not advertise itself (its own plugin does).
            lines.append(f"{r:32} {advertised.get(r, '-'):>10} {allocated.get(r, 0):>10}")
    lines.append("")
    lines.append("SHADOWS")
    for s in doc.get("shadows") or []:
        gpu = ",".join(s.get("gpu") or []) or "-"
        lines.append(f"  {s['pod']}  {s['phase']}  {s['resource']}  gpu={gpu}  users={len(s.get('users') or [])}")
        for u in s.get("users") or []:
            lines.append(f"      {u}")
        if s.get("unschedulable"):
            lines.append(f"      cannot be scheduled: {s['unschedulable']}")
        if s.get("unhealthy"):
            lines.append(f"      slots Unhealthy: {s['unhealthy']}")
    lines.append("SHARERS")
    for p in doc.get("sharers") or []:
        shadows = ",".join(p.get("shadows") or []) or "-"
        lines.append(f"  {p['pod']}  {p['phase']}  {p['resource']} x{p.get('quantity', 1)}  shadow={shadows}")
    _render_spot(doc, lines)
    lines.append("RECENT EVICTIONS")
    for e in doc.get("evictions") or []:
        when = time.strftime("%H:%M:%S", time.gmtime(float(e.get("at") or 0)))
        lines.append(f"  {when}Z {e['pod']} {e['reason']}: {e['message']}")
    if not doc.get("evictions"):
        lines.append("  (none)" if doc.get("source") == "agent" else "  (unknown without the agent)")
    return "\n".join(lines)


def _render_spot(doc: dict[str, Any], lines: list[str]) -> None:
    """Spot: how returns are seen, whether lending is blocked and why, each GPU's state and why,
    the kills that went wrong, the last return's latencies."""
    rt = doc.get("spot_runtime") or {}
    if not rt and not doc.get("spot"):
        return
    lines.append("SPOT" + (f"  (returns seen by: {rt['mode']})" if rt.get("mode") else ""))
    if rt.get("lending_blocked"):
        lines.append(f"  LENDING BLOCKED: {rt['lending_blocked']}")
    elif rt.get("cgroups"):
        lines.append(f"  pod cgroups: {rt['cgroups']}")
    for g in doc.get("spot") or []:
        borrowers = ",".join(g.get("borrowers") or []) or "-"
        lines.append(f"  {g['real_id']}  {g['state']}  owner={g.get('owner') or '-'}  borrowers={borrowers}")
        if g.get("reason"):
            lines.append(f"      {g['reason']}")
    errors = rt.get("kill_errors") or {}
    exceeded = int(rt.get("kill_bound_exceeded") or 0)
    if errors or exceeded:
        listed = ", ".join(f"{k}={v}" for k, v in sorted(errors.items())) or "none"
        lines.append(
            f"  KILL ERRORS: {listed}; tasks alive past the {rt.get('kill_bound_s', '?')}s bound: {exceeded} "
            "(owner released anyway)"
        )
    last = rt.get("last_return") or {}
    if last:
        lines.append(f"  last return: {_describe_return(last)}")


def _describe_return(last: dict[str, Any]) -> str:
    who = ",".join(last.get("pods") or []) or "nothing lent"
    parts = [f"owner {last['owner']}" if last.get("owner") else "", f"borrowers {who}"]
    if "return_to_dead_ms" in last:
        parts.append(f"dead {last['return_to_dead_ms']} ms after the owner's signal")
    if last.get("error"):
        parts.append(f"KILL FAILED ({last['error']})")
    if last.get("bound_exceeded"):
        parts.append("tasks outlived the kill bound")
    if "release_ms" in last:
        parts.append(f"owner released after {last['release_ms']} ms")
    return "; ".join(p for p in parts if p)


__all__ = ["render_text"]
