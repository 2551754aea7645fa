"""Our own Prometheus text-format (0.0.4) parser: lenient per line, never fatal.

Why our own and not ``prometheus_client``'s: that parser raises on the first bad line and
so throws the whole scrape away (dcgm-exporter 3.x emitted ``ERROR - FAILED TO CONVERT TO
STRING`` as a value for some families). Here a line that does not parse is skipped
and counted, and every other line still counts. It is also a runtime dependency we do not
need: the agent only reads exporter output.

What is accepted, per line (after stripping surrounding whitespace):

- blank lines and ``#`` lines (HELP, TYPE, EOF, free comments) are skipped, never bad;
- ``name value [timestamp_ms]`` and ``name{l="v",...} value [timestamp_ms]``, with any run
  of spaces or tabs between the parts, label names in any order, a trailing comma, and the
  escapes ``\\\\``, ``\\"`` and ``\\n`` in label values;
- values as Go writes them: integers, decimals, exponents, ``NaN``, ``+Inf``/``-Inf``.
  Non-finite values are kept (the adapters turn them into "unknown"); the timestamp must be
  an integer (milliseconds, as the Ascend exporter writes).

- the words exporters write where a value is not measured or not supported (``N/A``,
  ``[N/A]``, ``NA``, ``[Not Supported]``, ``Not Supported`` as nvidia-smi and amd-smi print
  them, and DCGM's string blanks ``<<<NULL>>>``, ``<<<NOT_FOUND>>>``, ``<<<NOT_SUPPORTED>>>``,
  ``<<<NOT_PERM>>>``): the sample is kept with the value NaN, so it reads as unknown and is
  not a bad line (docs/metrics.md, "Sentinels").

Everything else is a bad line: no value, a non-numeric value (including digit separators
such as ``1_000`` that Python's ``float`` would take), an invalid metric or label name, an
unterminated label set, a repeated label name, or extra fields.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

__all__ = ["UNAVAILABLE_WORDS", "ParsedText", "Sample", "parse_text"]

# How many bad lines are quoted back (the count is always exact).
MAX_BAD_EXAMPLES = 5
# A quoted bad line is cut to this many characters: a 1 MB garbage line must not reach a log.
MAX_EXAMPLE_CHARS = 120

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
# No pattern below may let two whitespace runs compete for the same spaces: a line of 30k
# spaces must cost linear time, not quadratic (checked in the unit tests).
_VALUE = r'"((?:[^"\\\n]|\\.)*)"'
_PAIR_NOCAP = r'[a-zA-Z_][a-zA-Z0-9_]*\s*=\s*"(?:[^"\\\n]|\\.)*"\s*'
_LABELS_OK = re.compile(rf"\s*(?:{_PAIR_NOCAP}(?:,\s*{_PAIR_NOCAP})*(?:,\s*)?)?")
_LABEL_PAIRS = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*{_VALUE}")
_ESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_TIMESTAMP = re.compile(r"-?[0-9]+")


class Sample(NamedTuple):
    """One sample line. ``labels`` is shared between samples with the same label text: read-only."""

    name: str
    labels: Mapping[str, str]
    value: float
    timestamp_ms: int | None


@dataclass(frozen=True, slots=True)
class ParsedText:
    """Every sample that parsed, plus the exact count of lines that did not."""

    samples: tuple[Sample, ...]
    bad_lines: int
    # ``"line 12: non-numeric value: DCGM_FI_DEV_X{...} ERROR"``, at most MAX_BAD_EXAMPLES of them.
    bad_line_examples: tuple[str, ...]


class _BadLine(Exception):
    """Internal: why one line was skipped. Never leaves this module."""


def _unescape(value: str) -> str:
    return _ESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def _parse_labels(text: str) -> dict[str, str]:
    if _LABELS_OK.fullmatch(text) is None:
        raise _BadLine("malformed label set")
    pairs = _LABEL_PAIRS.findall(text)
    labels = {name: (_unescape(value) if "\\" in value else value) for name, value in pairs}
    if len(labels) != len(pairs):
        raise _BadLine("repeated label name")
    return labels


# "Not measured / not supported" spelled as text; the value is then unknown, never a number.
UNAVAILABLE_WORDS = frozenset(
    {
        "N/A",
        "[N/A]",
        "NA",
        "[Not Supported]",
        "Not Supported",
        "<<<NULL>>>",
        "<<<NOT_FOUND>>>",
        "<<<NOT_SUPPORTED>>>",
        "<<<NOT_PERM>>>",
    }
)


def _unavailable(rest: Sequence[str]) -> tuple[bool, int | None]:
    """Whether the value fields are one of UNAVAILABLE_WORDS, and the timestamp after it if any."""
    text = " ".join(rest)
    if text in UNAVAILABLE_WORDS:
        return True, None
    head, _, last = text.rpartition(" ")
    if head in UNAVAILABLE_WORDS and _TIMESTAMP.fullmatch(last):
        return True, int(last)
    return False, None


_N = TypeVar("_N", int, float)


def _parse_number(text: str, kind: type[_N], what: str) -> _N:
    # float() and int() also take "1_000"; the exposition format does not.
    if "_" not in text:
        try:
            return kind(text)
        except ValueError:
            pass
    raise _BadLine(f"{what}: {text[:40]!r}")


def parse_text(text: str) -> ParsedText:
    """Parse one scrape. Never raises: a line that does not parse is counted in ``bad_lines``."""
    samples: list[Sample] = []
    bad = 0
    examples: list[str] = []
    # Exporters repeat one label set per device across every family; parse each text once.
    label_cache: dict[str, Mapping[str, str]] = {}
    known_names: set[str] = set()
    empty: Mapping[str, str] = {}
    append = samples.append

    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        try:
            brace = line.find("{")
            if brace < 0:
                fields = line.split()
                name = fields[0]
                labels = empty
                rest = fields[1:]
            else:
                name = line[:brace].rstrip()
                close = line.rfind("}")
                if close < brace:
                    raise _BadLine("unterminated label set")
                label_text = line[brace + 1 : close]
                cached = label_cache.get(label_text)
                if cached is None:
                    cached = label_cache[label_text] = _parse_labels(label_text)
                labels = cached
                rest = line[close + 1 :].split()
            if name not in known_names:
                if _METRIC_NAME.fullmatch(name) is None:
                    raise _BadLine(f"invalid metric name {name[:40]!r}")
                known_names.add(name)
            if not rest:
                raise _BadLine("no value")
            try:
                if len(rest) > 2:
                    raise _BadLine("extra fields after the timestamp")
                value = _parse_number(rest[0], float, "non-numeric value")
                timestamp = _parse_number(rest[1], int, "timestamp is not an integer") if len(rest) == 2 else None
            except _BadLine:
                # Only a line that is not a number pays for this check.
                is_word, timestamp = _unavailable(rest)
                if not is_word:
                    raise
                value = math.nan
        except _BadLine as exc:
            bad += 1
            if len(examples) < MAX_BAD_EXAMPLES:
                shown = line if len(line) <= MAX_EXAMPLE_CHARS else line[:MAX_EXAMPLE_CHARS] + "..."
                examples.append(f"line {lineno}: {exc}: {shown}")
            continue
        append(Sample(name, labels, value, timestamp))

    return ParsedText(tuple(samples), bad, tuple(examples))
