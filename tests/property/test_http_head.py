"""The endpoint's request-head parser on any bytes a client can send (hypothesis): a Request or the
Response refusing it, never an exception; and a Request only for a well-formed GET."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from controller.io.bounded_http import Request, Response, parse_head

LINE = st.one_of(
    st.binary(max_size=80),
    st.sampled_from(
        [
            b"GET /metrics HTTP/1.1",
            b"Authorization: Bearer abc",
            b"authorization: bearer x y",
            b"Content-Length: 0",
            b"Content-Length: -1",
            b"Transfer-Encoding: chunked",
            b" folded",
            b"Host:",
            b":",
            b"\xff\xfe: \x00",
        ]
    ),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(LINE, max_size=80), st.sampled_from([b"\r\n", b"\n"]))
def test_any_head_is_a_request_or_a_refusal(lines: list[bytes], eol: bytes) -> None:
    parsed = parse_head(eol.join(lines) + eol + eol, client="10.0.0.1")
    assert isinstance(parsed, Request | Response)
    if isinstance(parsed, Request):
        assert parsed.method == "GET" and parsed.path.startswith("/")
        assert all(name == name.lower() for name in parsed.headers)
    else:
        assert parsed.code in (400, 405, 431) and parsed.body.startswith(b"gpushare: ")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    assert isinstance(parse_head(data), Request | Response)
