"""KubeClient's pure parts: API errors become ours, a bad watch line ends the watch, LISTs come in pages."""

from __future__ import annotations

from typing import Any

import pytest

from controller.errors import ApiUnavailable, KubeError, ResourceExpired, RetryLater
from controller.io.kube_client import LIST_PAGE, KubeClient, _translate, _watch_event


def test_rbac_denials_point_at_the_rbac_manifest() -> None:
    denied = b'{"message": "pods is forbidden: User \\"x\\" cannot create resource \\"pods\\""}'
    assert "manifests/20-rbac.yaml" in str(_translate(403, "POST /p", denied, None))
    assert "manifests/20-rbac.yaml" not in str(_translate(403, "POST /p", b'{"message": "no PriorityClass"}', None))


@pytest.mark.parametrize(
    ("status", "kind", "needle"),
    [
        (410, ResourceExpired, "listing again"),
        (429, ApiUnavailable, "retrying in 3s"),
        (503, ApiUnavailable, "answered 503"),
        (403, KubeError, "was refused with 403: bad pod"),
        (422, KubeError, "was refused with 422: bad pod"),
    ],
)
def test_api_errors_become_ours(status: int, kind: type[KubeError], needle: str) -> None:
    err = _translate(status, "POST /api/v1/pods", b'{"message": "bad pod"}', "3" if status == 429 else None)
    assert type(err) is kind and needle in str(err) and str(err).startswith("gpushare: POST /api/v1/pods")
    assert isinstance(err, RetryLater) == (kind is ApiUnavailable)


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b'{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}', ResourceExpired),
        (b'{"type": "ERROR", "object": {"code": 500, "message": "boom"}}', ApiUnavailable),
        (b"{not json", ApiUnavailable),
        (b'{"type": "WEIRD", "object": {}}', ApiUnavailable),
    ],
)
def test_bad_watch_lines_end_the_watch_with_our_error(line: bytes, error: type[KubeError]) -> None:
    with pytest.raises(error, match=r"^gpushare: WATCH"):
        _watch_event(line, "WATCH /api/v1/pods")


def test_list_pods_reads_page_by_page_and_trims_each_page_as_it_comes() -> None:
    pages = [
        {"metadata": {"continue": "t1", "resourceVersion": "7"}, "items": [{"n": 1}, {"n": 2}]},
        {"metadata": {"continue": "t2", "resourceVersion": "7"}, "items": [{"n": 3}]},
        {"metadata": {"resourceVersion": "7"}, "items": []},
    ]
    asked: list[dict[str, Any]] = []
    seen_when: list[int] = []

    def call(method: str, path: str, *, query: dict[str, Any]) -> tuple[int, Any]:
        asked.append(dict(query))
        return 200, pages[len(asked) - 1]

    client = object.__new__(KubeClient)
    client._call = call  # type: ignore[method-assign,assignment]

    def each(pod: dict[str, Any]) -> dict[str, Any]:
        seen_when.append(len(asked))
        return {"trimmed": pod["n"]}

    items, rv = client.list_pods(field_selector="spec.nodeName=", each=each)
    assert items == [{"trimmed": 1}, {"trimmed": 2}, {"trimmed": 3}] and rv == "7"
    assert [q.get("continue") for q in asked] == [None, "t1", "t2"]
    assert all(q["limit"] == LIST_PAGE and q["fieldSelector"] == "spec.nodeName=" for q in asked)
    assert seen_when == [1, 1, 2]  # each page trimmed before the next is asked for
