"""kubectl's own flag values, read the way kubectl reads them: plain functions over strings.

    parse_request_timeout   ``--request-timeout``: "0", a bare integer (seconds) or a Go duration
    parse_selector          ``-l/--selector``: the label selector language of ``kubectl get -l``
    Requirement             one ``key op values`` term of a selector; ``matches`` checks a label map

kubectl hands both strings to client-go (``clientcmd.ParseTimeout``, ``labels.Parse``); the plugin
reads them itself so that ``status -l`` can select nodes, which the agent's API client lists whole,
with the same grammar as ``who -l`` selecting pods. A string kubectl would refuse is refused here
with an error naming what is wrong, before anything is read from the cluster.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

# Go's time.ParseDuration units, in seconds ("µs" and "μs" are the micro sign and the Greek mu).
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_SEGMENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_INTEGER = re.compile(r"[+-]?\d+")
TIMEOUT_HELP = "a single integer in seconds, or an integer followed by a unit (e.g. 1s | 2m | 3h); 0 waits forever"


def parse_request_timeout(text: str) -> float:
    """Seconds to wait for one API request; 0 means no timeout (kubectl's default).

    As client-go reads it: a non-negative integer is seconds (kubectl's old form), anything else a
    Go duration ("1m30s", "500ms", "1.5h"). A negative duration, which kubectl lets through to the
    HTTP client, is refused: no request can finish before it starts.
    """
    value = text
    if _INTEGER.fullmatch(value):
        seconds = int(value)
        if seconds < 0:
            raise ValueError(f"{text!r} is negative: use {TIMEOUT_HELP}")
        return float(seconds)
    sign, body = (value[0], value[1:]) if value[:1] in ("+", "-") else ("", value)
    total, pos = 0.0, 0
    while pos < len(body):
        m = _SEGMENT.match(body, pos)
        if m is None:
            raise ValueError(f"{text!r} is not a duration: use {TIMEOUT_HELP}")
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if not body:
        raise ValueError(f"{text!r} is not a duration: use {TIMEOUT_HELP}")
    if sign == "-" and total > 0:
        raise ValueError(f"{text!r} is negative: use {TIMEOUT_HELP}")
    return total


# -- label selectors (k8s.io/apimachinery/pkg/labels: Parse) ---------------------------------------------------

_SYMBOLS = ("!=", "==", "=", "!", "(", ")", ",", ">", "<")
_SPECIAL = frozenset("=!(),<>")
_WHITESPACE = frozenset(" \t\r\n")
_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
OPERATORS = ("in", "notin", "=", "==", "!=", ">", "<")


@dataclass(frozen=True)
class Requirement:
    """One term: ``key`` (exists), ``!key``, ``key=v``/``==``/``!=``, ``key in (..)``/``notin``, ``key>n``/``<``."""

    key: str
    op: str  # "exists", "!", or one of OPERATORS
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!":
            return value is None
        if self.op in ("=", "==", "in"):
            return value is not None and value in self.values
        if self.op in ("!=", "notin"):
            return value is None or value not in self.values
        if value is None or not _INTEGER.fullmatch(value):
            return False
        (bound,) = self.values
        return int(value) > int(bound) if self.op == ">" else int(value) < int(bound)


def matches(selector: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    """Whether an object with these labels is selected (every term holds; no term selects all)."""
    return all(r.matches(labels or {}) for r in selector)


def _tokens(text: str) -> list[str]:
    """The selector's words and symbols; the longest symbol wins ("!=" over "!")."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] in _WHITESPACE:
            i += 1
        elif text[i] in _SPECIAL:
            symbol = next(s for s in _SYMBOLS if text.startswith(s, i))
            out.append(symbol)
            i += len(symbol)
        else:
            j = i
            while j < len(text) and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
                j += 1
            out.append(text[i:j])
            i = j
    return out


def _is_word(token: str | None) -> bool:
    return token is not None and token not in _SYMBOLS


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    problems = []
    if slash and not prefix:
        problems.append("the prefix before '/' is empty")
    if slash and prefix and (len(prefix) > 253 or not all(_DNS_LABEL.fullmatch(p) for p in prefix.split("."))):
        problems.append(f"the prefix {prefix!r} is not a DNS subdomain (lower case letters, digits, '-' and '.')")
    if not name or len(name) > 63 or not _NAME.fullmatch(name):
        problems.append(
            f"the name {name!r} must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a"
            " letter or digit"
        )
    if problems:
        raise ValueError(f"label key {key!r}: " + "; ".join(problems))


def _check_value(key: str, value: str) -> None:
    if value and (len(value) > 63 or not _NAME.fullmatch(value)):
        raise ValueError(
            f"label value {value!r} for {key!r} must be at most 63 letters, digits, '-', '_' or '.', starting and"
            " ending with a letter or digit"
        )


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _tokens(text)
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str | None:
        token = self.peek()
        self.pos += 1
        return token

    def check(self, check: Callable[..., None], *args: str) -> None:
        try:
            check(*args)
        except ValueError as exc:
            raise ValueError(f"{self.text!r}: {exc}") from None

    def fail(self, found: str | None, expected: str) -> ValueError:
        shown = "end of selector" if found is None else repr(found)
        return ValueError(f"{self.text!r}: found {shown}, expected {expected}")

    def requirement(self) -> Requirement:
        negated = self.peek() == "!"
        if negated:
            self.take()
        key = self.take()
        if not _is_word(key):
            raise self.fail(key, "a label key")
        assert key is not None  # for mypy: _is_word said so
        self.check(_check_key, key)
        if self.peek() in (None, ","):
            return Requirement(key, "!" if negated else "exists")
        if negated:
            raise self.fail(self.peek(), "',' or end of selector after '!KEY'")
        op = self.take()
        if op not in OPERATORS:
            raise self.fail(op, "one of " + ", ".join(OPERATORS))
        assert op is not None
        values = self.value_set() if op in ("in", "notin") else self.exact_value()
        for v in values:
            self.check(_check_value, key, v)
        if op in (">", "<") and not all(_INTEGER.fullmatch(v) for v in values):
            raise ValueError(f"{self.text!r}: {key}{op}{next(iter(values))!s}: '>' and '<' need an integer")
        return Requirement(key, op, frozenset(values))

    def exact_value(self) -> set[str]:
        if self.peek() in (None, ","):
            return {""}  # "key=" selects the empty value
        value = self.take()
        if not _is_word(value):
            raise self.fail(value, "a label value")
        return {str(value)}

    def value_set(self) -> set[str]:
        if (token := self.take()) != "(":
            raise self.fail(token, "'('")
        values: set[str] = set()
        expect_value = True
        while (token := self.take()) != ")":
            if token == ",":
                if expect_value:
                    values.add("")  # "(a,,b)" and "(,a)" hold the empty value, as in kubectl
                expect_value = True
            elif _is_word(token) and expect_value:
                values.add(str(token))
                expect_value = False
            else:
                raise self.fail(token, "a value, ',' or ')'")
        if expect_value:
            values.add("")  # "()" and "(a,)"
        return values


def parse_selector(text: str) -> tuple[Requirement, ...]:
    """A label selector as ``kubectl get -l`` reads it; ValueError names the first problem."""
    p = _Parser(text)
    out: list[Requirement] = []
    while p.peek() is not None:
        out.append(p.requirement())
        token = p.take()
        if token is None:
            break
        if token != ",":
            raise p.fail(token, "',' or end of selector")
        if p.peek() is None or not (_is_word(p.peek()) or p.peek() == "!"):
            raise p.fail(p.peek(), "a requirement after ','")
    return tuple(out)


__all__ = ["TIMEOUT_HELP", "Requirement", "matches", "parse_request_timeout", "parse_selector"]
