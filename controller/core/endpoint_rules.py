"""Who the agent's endpoint serves, and how much of the agent its clients may hold.

Access follows the convention Kubernetes operators know from controller-runtime's
``filters.WithAuthenticationAndAuthorization`` and kube-rbac-proxy: a bearer token that a
TokenReview authenticates, then a SubjectAccessReview of the non-resource URL with verb ``get``;
the answer is cached briefly, in a cache of bounded size. Loopback clients are the node itself
(kubelet's probes, ``gpushare status``): they are served without a token, as ``/status`` always was.

Plain functions over plain data: the review bodies to send and the reading of the answers, the
cache (the caller passes ``now``), and which connection may take a free slot. The reviews' transport
is ``controller/io/access_reviews.py``; the server is ``controller/io/bounded_http.py``.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.config import METRICS_ACCESS_OPEN

METRICS_PATH = "/metrics"
HEALTHZ_PATH = "/healthz"
STATUS_PATH = "/status"
# The ClusterRole the chart ships for scrapers (manifests/20-rbac.yaml); named in every refusal.
READER_CLUSTER_ROLE = "gpushare-metrics-reader"
# The longest Authorization value read: a bound ServiceAccount token is about a kilobyte.
MAX_TOKEN_BYTES = 8192

# controller-runtime caches an allowed review for minutes and a denied one for 30 s; shorter here,
# since a scrape every 15-60 s needs only the next scrape to hit.
ALLOW_TTL_S = 60.0
DENY_TTL_S = 10.0
CACHE_ENTRIES = 256

# Slots of the endpoint that only loopback clients may take: kubelet's probes and `gpushare status`
# still get in while clients off the node hold every other slot.
LOOPBACK_RESERVE = 4
# At most this share of the slots open to clients off the node goes to one address.
PER_ADDRESS_SHARE = 4
# The endpoint's connections may use at most this share of the process's file descriptors: the
# rest stay for PodResources, the API, the plugins' sockets, metrics and cgroup reads.
FD_SHARE = 4


@dataclass(frozen=True)
class Verdict:
    """What one request gets: ``code`` 200 serves it; 401, 403 or 503 refuse it with ``reason``."""

    code: int
    reason: str
    user: str = ""

    @property
    def allowed(self) -> bool:
        return self.code == 200


SERVE = Verdict(200, "served without a review")


@dataclass(frozen=True)
class Identity:
    """The user a TokenReview names, as a SubjectAccessReview must repeat it."""

    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()


def is_loopback(host: str) -> bool:
    """``host`` is this machine's loopback (an IPv4-mapped one included); a name is not an address."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def before_review(path: str, *, loopback: bool, access: str) -> Verdict | None:
    """The verdict that needs no token, or None when a review of the request's token decides.

    ``/healthz`` is for kubelet's probes, which carry no token, and names nothing. ``/status``
    names pods and their devices: loopback only, whatever ``access`` says.
    """
    if path == STATUS_PATH and not loopback:
        return Verdict(403, "gpushare: /status is served to loopback clients only")
    if path == METRICS_PATH and not loopback and access != METRICS_ACCESS_OPEN:
        return None
    return SERVE


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None for anything else."""
    if not authorization or len(authorization) > MAX_TOKEN_BYTES:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        return None
    return token


def no_token(path: str) -> Verdict:
    return Verdict(
        401,
        f"gpushare: {path} names tenants' pods: send a bearer token the API server authenticates "
        f"(a ServiceAccount's, bound to the ClusterRole {READER_CLUSTER_ROLE})",
    )


def token_review_body(token: str) -> dict[str, Any]:
    """A TokenReview for the API server's own audiences, as controller-runtime sends it."""
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def _strings(value: object) -> tuple[str, ...] | None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return tuple(value)


def read_token_review(doc: object) -> Identity | Verdict:
    """The identity a TokenReview's answer authenticates, or the 401 it means.

    ``ValueError`` when the answer is not shaped as a TokenReview's: the API server's fault, which
    the caller answers with 503 and does not cache.
    """
    status = doc.get("status") if isinstance(doc, Mapping) else None
    if not isinstance(status, Mapping):
        raise ValueError("the TokenReview answer has no status")
    if status.get("authenticated") is not True:
        why = status.get("error")
        detail = f" ({why})" if isinstance(why, str) and why else ""
        return Verdict(401, f"gpushare: the API server did not authenticate the bearer token{detail}")
    user = status.get("user")
    if not isinstance(user, Mapping) or not isinstance(user.get("username"), str) or not user["username"]:
        raise ValueError("the TokenReview answer authenticates no username")
    name: str = user["username"]
    uid = user.get("uid", "")
    groups = _strings(user.get("groups", []))
    extra_doc = user.get("extra")
    if extra_doc is None:
        extra_doc = {}
    if not isinstance(uid, str) or groups is None or not isinstance(extra_doc, Mapping):
        raise ValueError(f"the TokenReview answer for {name} has a uid, groups or extra of the wrong type")
    extra: list[tuple[str, tuple[str, ...]]] = []
    for key, values in sorted(extra_doc.items()):
        strings = _strings(values)
        if not isinstance(key, str) or strings is None:
            raise ValueError(f"the TokenReview answer for {name} has an extra field of the wrong type")
        extra.append((key, strings))
    return Identity(name, uid, groups, tuple(extra))


def access_review_body(identity: Identity, path: str, verb: str = "get") -> dict[str, Any]:
    """A SubjectAccessReview: may ``identity`` ``verb`` the non-resource URL ``path``?"""
    spec: dict[str, Any] = {
        "user": identity.user,
        "groups": list(identity.groups),
        "nonResourceAttributes": {"path": path, "verb": verb},
    }
    if identity.uid:
        spec["uid"] = identity.uid
    if identity.extra:
        spec["extra"] = {k: list(v) for k, v in identity.extra}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def read_access_review(doc: object, identity: Identity, path: str, verb: str = "get") -> Verdict:
    """200 when the SubjectAccessReview allows it, else the 403 naming the ClusterRole to bind.

    ``ValueError`` when the answer is not shaped as a SubjectAccessReview's (503, not cached).
    """
    status = doc.get("status") if isinstance(doc, Mapping) else None
    if not isinstance(status, Mapping) or not isinstance(status.get("allowed", False), bool):
        raise ValueError("the SubjectAccessReview answer has no status")
    if status.get("allowed") is True and status.get("denied") is not True:
        return Verdict(200, f"{identity.user} may {verb} {path}", identity.user)
    return Verdict(
        403,
        f"gpushare: {identity.user} may not {verb} {path}: bind it to the ClusterRole {READER_CLUSTER_ROLE}",
        identity.user,
    )


def cache_key(token: str, path: str) -> str:
    """What the cache is keyed by: never the token itself, so a memory dump shows none."""
    return hashlib.sha256(f"{path}\0{token}".encode()).hexdigest()


@dataclass
class ReviewCache:
    """Verdicts by ``cache_key``: allowed ones for ``allow_ttl_s``, refusals for ``deny_ttl_s``.

    At most ``max_entries``: a client sending a new token with every request evicts the oldest
    entries instead of growing the agent. 503 verdicts are never kept: the next request asks again.
    Not thread-safe: the caller holds a lock around each call (no I/O happens inside).
    """

    max_entries: int = CACHE_ENTRIES
    allow_ttl_s: float = ALLOW_TTL_S
    deny_ttl_s: float = DENY_TTL_S
    _entries: OrderedDict[str, tuple[float, Verdict]] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, now: float) -> Verdict | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, verdict = entry
        if now >= expires:
            del self._entries[key]
            return None
        return verdict

    def put(self, key: str, verdict: Verdict, now: float) -> None:
        if verdict.code not in (200, 401, 403):
            return
        ttl = self.allow_ttl_s if verdict.allowed else self.deny_ttl_s
        self._entries.pop(key, None)
        if len(self._entries) >= self.max_entries:
            for old in [k for k, (expires, _) in self._entries.items() if now >= expires]:
                del self._entries[old]
        while len(self._entries) >= self.max_entries:
            self._entries.popitem(last=False)
        self._entries[key] = (now + ttl, verdict)


def per_address_limit(capacity: int) -> int:
    """How many connections one address off the node may hold at once."""
    return max(1, (capacity - LOOPBACK_RESERVE) // PER_ADDRESS_SHARE)


def admits(*, capacity: int, busy: int, from_address: int, loopback: bool) -> bool:
    """Whether a new connection may take a slot now (``busy`` in use, ``from_address`` of them from
    its address); otherwise it is refused at once, never queued.

    Loopback clients may take every slot. Others leave ``LOOPBACK_RESERVE`` free, and one address
    holds at most ``per_address_limit``, so a single client off the node cannot shut out a scraper.
    """
    if loopback:
        return busy < capacity
    return busy < capacity - LOOPBACK_RESERVE and from_address < per_address_limit(capacity)


def fd_budget_problem(max_connections: int, fd_soft_limit: int | None) -> str | None:
    """Why ``max_connections`` is too many for the process's file-descriptor limit (None: it fits).

    ``fd_soft_limit`` None: no limit. Each connection holds one descriptor while it is served.
    """
    if fd_soft_limit is None or max_connections * FD_SHARE <= fd_soft_limit:
        return None
    return (
        f"metrics.maxConnections is {max_connections}, but the agent may open only {fd_soft_limit} files: "
        f"the endpoint may use at most a {FD_SHARE}th of them ({fd_soft_limit // FD_SHARE}), so that spot "
        "reclaim, metrics and cgroup reads always have theirs; lower metrics.maxConnections or raise the "
        "agent's open-files limit (RLIMIT_NOFILE)"
    )


__all__ = [
    "ALLOW_TTL_S",
    "CACHE_ENTRIES",
    "DENY_TTL_S",
    "FD_SHARE",
    "HEALTHZ_PATH",
    "LOOPBACK_RESERVE",
    "METRICS_PATH",
    "READER_CLUSTER_ROLE",
    "SERVE",
    "STATUS_PATH",
    "Identity",
    "ReviewCache",
    "Verdict",
    "access_review_body",
    "admits",
    "bearer_token",
    "before_review",
    "cache_key",
    "fd_budget_problem",
    "is_loopback",
    "no_token",
    "per_address_limit",
    "read_access_review",
    "read_token_review",
    "token_review_body",
]
