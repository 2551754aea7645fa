"""The mapping records gpushare writes on pods (design §3): who uses a shadow, which shadow a sharer holds.

``ANNOTATION_SHADOW_USERS`` on a shadow: ``{"<ns>/<pod>/<container>": ["<virtual ID>", ...]}``;
``ANNOTATION_SHADOW_OWNER`` on a sharer: ``{"<ns>/<shadow>": "<shadow uid>"}``. Both are records
for people, ``gpushare status`` and the leader's slot count, rebuilt every pass from PodResources
(``controller.core.mapping``). Pure module: stdlib and ``gpushare`` only (docs/architecture.md).
"""

from __future__ import annotations

import json
import json.scanner
from collections.abc import Iterable, Mapping
from typing import Any

from gpushare import installation

# A pod name is a DNS subdomain, but a shadow's is ours and short (design §3); a uid is a UUID.
_MAX_NAME = 63
_MAX_UID = 64


def parse_users_annotation(value: str | None) -> dict[str, tuple[str, ...]]:
    """``{"ns/pod/container": ["vid", ...]}``; a malformed record reads as empty (it is rebuilt)."""
    doc = _load_json_object(value)
    out: dict[str, tuple[str, ...]] = {}
    for user, ids in doc.items():
        if isinstance(ids, list):
            try:
                "".join(ids)  # refuses any item that is not a str, in C
            except TypeError:
                continue
            out[user] = tuple(sorted(ids)) if len(ids) > 1 else tuple(ids)
    return out


def parse_owner_annotation(value: str | None) -> dict[str, str]:
    """``{"<ns>/<shadow>": "<uid>"}``, keeping only entries shaped like what the agent writes.

    The record sits on a tenant's pod, so the tenant can rewrite it: only names a shadow could
    have (``<installation namespace>/<name of at most 63 characters>``) and uid-sized values are kept, and
    nothing reads it as evidence (docs/security.md, "Records the agent writes on tenant pods").
    """
    doc = _load_json_object(value)
    prefix = installation.namespace() + "/"
    return {
        k: v
        for k, v in doc.items()
        if isinstance(v, str) and len(v) <= _MAX_UID and k.startswith(prefix) and 0 < len(k) - len(prefix) <= _MAX_NAME
    }


def _load_json_object(value: str | None) -> dict[str, Any]:
    # These annotations are our own records, rewritten every pass from PodResources; a
    # damaged one must not stop anything, so it reads as "no record" and gets rewritten.
    # RecursionError: json refuses nesting deeper than the interpreter's stack, which a
    # tenant-written value can reach in a few kilobytes of brackets.
    #
    # The scanner json.loads runs, without its layers of Python around it (the leader reads the
    # users record of every shadow on each pass): json.loads skips the same whitespace around
    # the value and refuses anything after it.
    if not value:
        return {}
    text = value.strip(_JSON_WHITESPACE)
    try:
        doc, end = _scan_json(text, 0)
    except (StopIteration, ValueError, RecursionError):
        return {}
    return doc if end == len(text) and isinstance(doc, dict) else {}


_JSON_WHITESPACE = " \t\n\r"  # what json's decoder skips before and after a value
# json.loads's own scanner (in C where it is built); typeshed's stub asks for a scanner where a
# decoder is what it reads its settings from.
_scan_json = json.scanner.make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


def encode_users_annotation(users: Mapping[str, Iterable[str]]) -> str:
    return json.dumps({u: sorted(ids) for u, ids in users.items()}, sort_keys=True, separators=(",", ":"))


def encode_owner_annotation(shadows: Mapping[str, str]) -> str:
    return json.dumps(dict(shadows), sort_keys=True, separators=(",", ":"))


__all__ = ["encode_owner_annotation", "encode_users_annotation", "parse_owner_annotation", "parse_users_annotation"]
