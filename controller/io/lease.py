"""The ``gpushare-controller`` Lease: acquire, renew, lose and release it (design §1).

``LeaseElector`` reads and writes the Lease through ``KubeClient``; what to write is decided
by the pure rule ``controller.core.lease.decide_lease``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

from controller.core.lease import LeaseObservation, decide_lease, format_micro_time
from controller.errors import KubeError
from controller.io.kube_client import KubeClient
from gpushare import installation, keys
from gpushare.log import kv

log = logging.getLogger(__name__)


class LeaseElector:
    """Holds the ``gpushare-controller`` Lease for cluster-wide work (design §1).

    Call ``try_acquire_or_renew`` every ``renew_s`` from one thread; ``is_leader`` turns
    False the moment a renew fails for longer than the lease could still be ours, so the
    caller stops cluster-wide work at once.
    """

    def __init__(
        self,
        client: KubeClient,
        holder: str,
        *,
        namespace: str | None = None,
        name: str = keys.LEASE_NAME,
        duration_s: int = 15,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._client = client
        self.holder = holder
        # Read at construction, not at import: the namespace is set from the config at start.
        self.namespace = namespace or installation.namespace()
        self.name = name
        self.duration_s = duration_s
        self._clock = clock
        self._wall = wall_clock
        self._observed: LeaseObservation | None = None
        self._valid_until = float("-inf")

    def is_leader(self) -> bool:
        return self._clock() < self._valid_until

    def try_acquire_or_renew(self) -> bool:
        started = self._clock()
        try:
            lease = self._client.get_lease(self.namespace, self.name)
            decision, self._observed = decide_lease(
                (lease or {}).get("spec") if lease is not None else None,
                holder=self.holder,
                duration_s=self.duration_s,
                wall_now=self._wall(),
                mono_now=started,
                observed=self._observed,
            )
            if decision.action == "wait":
                self._valid_until = float("-inf")
                return False
            rv = None if lease is None else str(lease["metadata"]["resourceVersion"])
            won = self._client.write_lease(self.namespace, self.name, decision.spec, rv)
        except KubeError as exc:
            log.warning("lease renew failed", extra=kv(lease=self.name, reason=str(exc), leader=self.is_leader()))
            return self.is_leader()
        was_leader = self.is_leader()
        # Count from before the GET: the lease may have been written at any moment after it.
        self._valid_until = started + self.duration_s * 0.8 if won else float("-inf")
        if won != was_leader or decision.action in ("create", "take"):
            log.info(
                "lease", extra=kv(decision=decision.action if won else "lost", lease=self.name, holder=self.holder)
            )
        return won

    def release(self) -> None:
        """On clean shutdown: give the lease up so another agent takes over at once."""
        if not self.is_leader():
            return
        self._valid_until = float("-inf")
        try:
            lease = self._client.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.holder:
                return
            spec = {**lease["spec"], "holderIdentity": "", "renewTime": format_micro_time(self._wall())}
            self._client.write_lease(self.namespace, self.name, spec, str(lease["metadata"]["resourceVersion"]))
        except KubeError as exc:
            log.warning("lease release failed", extra=kv(lease=self.name, reason=str(exc)))


__all__ = ["LeaseElector"]
