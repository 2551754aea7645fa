"""How ``kubectl gpushare`` prints: kubectl's tables (upper-case headers, columns two spaces
apart, ``-o wide`` adds columns), ``-o json`` and ``-o yaml``, and colour only where a person
reads it. Pure functions of their arguments, so the tests read exactly what a terminal gets.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from cli.kubectl.explain import Explanation
from cli.kubectl.view import GpuUse, NodeRow

OUTPUTS = ("", "wide", "json", "yaml")

GREEN, RED, YELLOW, BOLD, RESET = "\x1b[32m", "\x1b[31m", "\x1b[33m", "\x1b[1m", "\x1b[0m"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def use_colour(is_tty: bool, env: Mapping[str, str]) -> bool:
    """Colour on a terminal only, and never when NO_COLOR is set to anything (https://no-color.org)."""
    return is_tty and not env.get("NO_COLOR")


def paint(text: str, colour: str, on: bool) -> str:
    return f"{colour}{text}{RESET}" if on and colour else text


def visible_len(text: str) -> int:
    return len(_ANSI.sub("", text))


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], colour: bool) -> str:
    """kubectl's layout: left-aligned columns, two spaces apart, widths from the visible text."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, visible_len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = []
    for row in [[paint(h, BOLD, colour) for h in headers], *rows]:
        lines.append("  ".join(cell + " " * (w - visible_len(cell)) for cell, w in zip(row, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def serialise(doc: Any, output: str) -> str:
    if output == "json":
        return json.dumps(doc, indent=2, sort_keys=False, default=str)
    return str(yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)).rstrip("\n")


def as_dict(value: Any) -> dict[str, Any]:
    """A dataclass as plain JSON types (tuples become lists, which yaml.safe_dump also needs)."""
    doc: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(value)))
    return doc


def _tri(value: bool | None, yes: str, no: str, colour: bool) -> str:
    if value is None:
        return paint("unknown", YELLOW, colour)
    return paint(yes, GREEN, colour) if value else paint(no, RED, colour)


def status_table(rows: Sequence[NodeRow], wide: bool, colour: bool) -> str:
    headers = ["NODE", "AGENT", "READY", "LEADER", "NRI", "GPUS", "SHADOWS", "SHARERS", "BORROWERS", "PROBLEMS"]
    if wide:
        headers += ["RESTARTS", "LAST-PASS", "SOURCE", "SPOT", "OFFERS"]
    out = []
    for r in rows:
        problems = paint(str(len(r.problems)), RED, colour) if r.problems else "0"
        cells = [
            r.node,
            r.agent_pod or paint("none", RED, colour),
            _tri(r.agent_ready, "true", "false", colour) if r.agent_pod else "-",
            "*" if r.leader else "",
            _tri(r.nri, "connected", "DISCONNECTED", colour),
            str(r.gpus),
            str(r.shadows),
            str(r.sharers),
            str(r.borrowers),
            problems,
        ]
        if wide:
            age = "-" if r.last_pass_age_s is None else f"{r.last_pass_age_s:.0f}s"
            spot = ",".join(f"{k}={v}" for k, v in r.spot.items()) or "-"
            offers = ",".join(f"{k.removeprefix('gpushare/')}={v}" for k, v in r.advertised.items()) or "-"
            cells += [str(r.restarts), age, r.source, spot, offers]
        out.append(cells)
    text = table(headers, out, colour)
    notes = [paint(f"{r.node}: {p}", YELLOW, colour) for r in rows for p in r.problems]
    return text + ("\n\n" + "\n".join(notes) if notes else "")


def who_table(uses: Sequence[GpuUse], wide: bool, colour: bool) -> str:
    headers = ["NODE", "GPU", "ROLE", "POD", "CONTAINER", "VIA", "PHASE"]
    if wide:
        headers += ["RESOURCE"]
    role_colour = {"owner": GREEN, "shadow": BOLD, "borrower": YELLOW}
    out = []
    for u in uses:
        cells = [
            u.node or "-",
            ",".join(u.gpu) or paint("?", YELLOW, colour),
            paint(u.role, role_colour.get(u.role, ""), colour),
            u.pod,
            u.container,
            u.via or "-",
            paint(u.phase, GREEN if u.phase == "Running" else YELLOW, colour),
        ]
        if wide:
            cells.append(u.resource or "-")
        out.append(cells)
    return table(headers, out, colour)


def why_text(e: Explanation, colour: bool) -> str:
    state_colour = {"Running": GREEN, "Pending": YELLOW}.get(e.state, RED)
    head = paint(f"{e.pod}: {e.state}" + (f" ({e.reason})" if e.reason else ""), state_colour, colour)
    body = e.explanation + (" " + paint("Fix:", BOLD, colour) + " " + e.fix if e.fix else "")
    return f"{head}\n{body}"


__all__ = [
    "OUTPUTS",
    "as_dict",
    "paint",
    "serialise",
    "status_table",
    "table",
    "use_colour",
    "visible_len",
    "who_table",
    "why_text",
]
