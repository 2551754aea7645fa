"""``kubectl gpushare``'s readers of kubectl's flag values on any text (hypothesis): a value or a
ValueError naming the text, never another exception; and what they print they read back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cli.kubectl.flags import Requirement, matches, parse_request_timeout, parse_selector

UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
SEGMENT = st.tuples(st.integers(0, 10_000), st.sampled_from(sorted(UNITS)))


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="0123456789.+-smhunµ x", max_size=12))
def test_any_timeout_text_is_seconds_or_a_named_refusal(text: str) -> None:
    try:
        seconds = parse_request_timeout(text)
    except ValueError as exc:
        assert repr(text) in str(exc)
    else:
        assert seconds >= 0


@settings(max_examples=300, deadline=None)
@given(st.lists(SEGMENT, min_size=1, max_size=4))
def test_a_written_duration_reads_back_as_its_sum(segments: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in segments)
    expected = sum(n * UNITS[unit] for n, unit in segments)
    assert abs(parse_request_timeout(text) - expected) <= 1e-9 * max(1.0, expected)


NAME = st.from_regex(r"[a-z0-9]([-a-z0-9_.]{0,10}[a-z0-9])?", fullmatch=True)
KEY = st.one_of(NAME, st.builds(lambda p, n: f"{p}.io/{n}", st.from_regex(r"[a-z]{1,8}", fullmatch=True), NAME))
VALUE = st.one_of(st.just(""), NAME)
REQUIREMENT = st.one_of(
    st.builds(Requirement, KEY, st.sampled_from(["exists", "!"])),
    st.builds(lambda k, op, v: Requirement(k, op, frozenset({v})), KEY, st.sampled_from(["=", "==", "!="]), VALUE),
    st.builds(
        lambda k, op, vs: Requirement(k, op, frozenset(vs)),
        KEY,
        st.sampled_from(["in", "notin"]),
        st.sets(VALUE, min_size=1, max_size=3),
    ),
    st.builds(
        lambda k, op, n: Requirement(k, op, frozenset({str(n)})), KEY, st.sampled_from([">", "<"]), st.integers(0, 99)
    ),
)


def _written(r: Requirement, space: str) -> str:
    if r.op == "exists":
        return r.key
    if r.op == "!":
        return f"!{space}{r.key}"
    if r.op in ("in", "notin"):
        return f"{r.key} {r.op}{space}({','.join(sorted(r.values))})"
    (value,) = r.values
    return f"{r.key}{space}{r.op}{space}{value}"


@settings(max_examples=400, deadline=None)
@given(st.lists(REQUIREMENT, max_size=4), st.sampled_from(["", " ", "  ", "\t"]))
def test_a_written_selector_reads_back(reqs: list[Requirement], space: str) -> None:
    text = f",{space}".join(_written(r, space) for r in reqs)
    assert parse_selector(text) == tuple(reqs)


@settings(max_examples=400, deadline=None)
@given(
    st.text(alphabet="ab=!(),<> in notx0.-/_", max_size=24),
    st.dictionaries(st.sampled_from(["a", "b", "in", "x0"]), VALUE, max_size=3),
)
def test_any_selector_text_selects_or_is_refused_by_name(text: str, labels: dict[str, str]) -> None:
    try:
        selector = parse_selector(text)
    except ValueError as exc:
        assert str(exc).startswith(repr(text))
    else:
        assert isinstance(matches(selector, labels), bool)
