"""The one client of the agent's HTTP endpoint on this node: ``/healthz`` and ``/status``.

``/status`` answers on loopback only, so a wildcard ``metrics.listen`` (``0.0.0.0:9400``,
``[::]:9400``) is reached at 127.0.0.1; an IPv6 address is written in brackets in the config
and without them on the socket. ``gpushare status`` and ``gpushare doctor`` both ask here,
and ``kubectl gpushare`` reaches it through ``gpushare status`` in the agent's pod.
"""

from __future__ import annotations

import http.client
import json
from typing import Any

DEFAULT_TIMEOUT_S = 3.0
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def endpoint_address(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` as the agent listens -> where to connect; ``ValueError`` for a bad port."""
    host, _, port = listen.rpartition(":")
    if host in _WILDCARDS:
        host = "127.0.0.1"
    return host.strip("[]"), int(port)


def get(listen: str, path: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, bytes]:
    """One GET of ``path``: the status code and the body. ``OSError``, ``ValueError`` or
    ``http.client.HTTPException`` when the agent does not answer."""
    host, port = endpoint_address(listen)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def fetch_status(listen: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """The agent's ``/status`` document; ``OSError`` or ``ValueError`` when it cannot be had."""
    try:
        code, body = get(listen, "/status", timeout_s)
    except http.client.HTTPException as exc:
        raise OSError(f"/status: {exc}") from exc
    if code != 200:
        raise OSError(f"/status answered {code}: {body[:200]!r}")
    doc = json.loads(body)
    if not isinstance(doc, dict):
        raise ValueError("/status is not a JSON object")
    return doc


__all__ = ["endpoint_address", "fetch_status", "get"]
