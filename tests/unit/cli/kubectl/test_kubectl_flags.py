"""kubectl's flag values as the plugin reads them: ``--request-timeout`` (client-go's ParseTimeout)
and ``-l`` (apimachinery's labels.Parse), each against the answers kubectl gives."""

from __future__ import annotations

import pytest

from cli.kubectl.flags import Requirement, matches, parse_request_timeout, parse_selector


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),  # kubectl's default: no timeout
        ("30", 30.0),  # a bare integer is seconds
        ("+5", 5.0),
        ("-0", 0.0),
        ("30s", 30.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("1.5h", 5400.0),
        ("500ms", 0.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("2h45m", 9900.0),
        ("1500us", 0.0015),
        ("-0s", 0.0),
    ],
)
def test_request_timeout_reads_as_kubectl_does(text: str, seconds: float) -> None:
    assert parse_request_timeout(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("-1s", "negative"),
        ("-5", "negative"),
        ("", "not a duration"),
        ("5x", "not a duration"),
        ("1.5", "not a duration"),  # a fraction needs a unit
        ("1m5", "not a duration"),  # so does every part
        ("1hm", "not a duration"),
        (" 5s", "not a duration"),  # kubectl does not trim either
        ("s", "not a duration"),
        ("1h-1m", "not a duration"),
    ],
)
def test_a_bad_request_timeout_names_the_value_and_the_format(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as err:
        parse_request_timeout(text)
    assert repr(text) in str(err.value) and "1s | 2m | 3h" in str(err.value)


LABELS = {"app": "infer", "tier": "gpu", "gen": "3", "gpushare.k8s.io/enabled": "true", "empty": ""}


@pytest.mark.parametrize(
    ("selector", "selected"),
    [
        ("", True),
        ("app", True),
        ("nope", False),
        ("!nope", True),
        ("!app", False),
        ("app=infer", True),
        ("app==infer", True),
        ("app=train", False),
        ("app!=train", True),
        ("nope!=x", True),  # != and notin also select objects without the key
        ("app in (train, infer)", True),
        ("app notin (train,infer)", False),
        ("nope notin (x)", True),
        ("nope in (x)", False),
        ("gen>2", True),
        ("gen<3", False),
        ("app>2", False),  # not a number: never greater or less
        ("nope>2", False),
        ("gpushare.k8s.io/enabled=true,tier=gpu", True),
        ("gpushare.k8s.io/enabled=true,tier=cpu", False),
        ("empty=", True),  # "key=" selects the empty value
        ("empty in ()", True),
        ("app in (a,,b)", False),
        ("empty in (a,,b)", True),
        ("  app = infer ,  tier  ", True),
    ],
)
def test_selectors_select_as_kubectl_get_l(selector: str, selected: bool) -> None:
    assert matches(parse_selector(selector), LABELS) is selected


def test_keywords_and_values_parse_as_in_apimachinery() -> None:
    assert parse_selector("in in (in,notin)") == (Requirement("in", "in", frozenset({"in", "notin"})),)
    assert parse_selector("x in (foo,,baz),y,z notin ()") == (
        Requirement("x", "in", frozenset({"foo", "", "baz"})),
        Requirement("y", "exists"),
        Requirement("z", "notin", frozenset({""})),
    )
    assert parse_selector("a!=b,!c") == (Requirement("a", "!=", frozenset({"b"})), Requirement("c", "!"))


@pytest.mark.parametrize(
    ("selector", "why"),
    [
        ("a,", "requirement after ','"),
        (",a", "expected a label key"),
        ("a=b=c", "expected ',' or end of selector"),
        ("a in b", "expected '('"),
        ("a in (b", "end of selector"),
        ("a in (b c)", "a value, ',' or ')'"),
        ("!a=b", "after '!KEY'"),
        ("a b", "expected one of in, notin"),
        ("a>x", "need an integer"),
        ("a>", "need an integer"),
        ("A/b=c", "not a DNS subdomain"),
        ("/b", "prefix before '/' is empty"),
        ("-a=b", "the name '-a'"),
        ("a=" + "v" * 64, "at most 63"),
        ("a=-v", "label value '-v'"),
        ("k" * 64, "1 to 63"),
    ],
)
def test_a_bad_selector_names_the_problem(selector: str, why: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_selector(selector)
    assert str(err.value).startswith(repr(selector)) and why in str(err.value), err.value


def test_no_labels_at_all_is_an_empty_label_map() -> None:
    assert matches(parse_selector("!app"), None)
    assert not matches(parse_selector("app"), None)
