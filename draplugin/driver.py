"""The DRA driver's answer to kubelet: prepare and unprepare claims, one claim at a time.

For each claim kubelet names, the driver reads the claim from the API (the only read it does on
this path), plans it (``claims.plan_claim``) against what the node publishes and what is already
prepared, and records it (``state.PreparedClaims``). A claim's failure is that claim's error; the
others go on. An API that cannot be reached fails the claim with the reason, and kubelet retries.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from draplugin.claims import ClaimRef, ClaimRefused, NodeView, PreparedClaim, plan_claim
from draplugin.pool import DeviceInfo
from draplugin.state import PreparedClaims
from gpushare.log import kv

log = logging.getLogger(__name__)

ReadClaim = Callable[[str, str], Mapping[str, Any]]


class Driver:
    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        devices: Callable[[], Mapping[str, DeviceInfo]],
        read_claim: ReadClaim,
        state: PreparedClaims,
        blocked: Callable[[], Mapping[str, str]] = dict,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self._devices = devices
        self._read_claim = read_claim
        self.state = state
        self._blocked = blocked
        self.on_change = on_change

    def prepare(self, refs: Iterable[ClaimRef]) -> dict[str, PreparedClaim | str]:
        """UID → the prepared claim, or the reason it was not prepared."""
        out: dict[str, PreparedClaim | str] = {}
        for ref in refs:
            try:
                out[ref.uid] = self._prepare_one(ref)
            except ClaimRefused as exc:
                log.warning("claim refused %s", kv(claim=str(ref), reason=str(exc)))
                out[ref.uid] = str(exc)
            except Exception as exc:  # one claim's failure must not fail the others
                log.warning("claim not prepared %s", kv(claim=str(ref), reason=repr(exc)))
                out[ref.uid] = f"preparing claim {ref}: {exc}"
        return out

    def _prepare_one(self, ref: ClaimRef) -> PreparedClaim:
        existing = self.state.get(ref.uid)
        if existing is not None:
            return existing
        claim = self._read_claim(ref.namespace, ref.name)
        devices = self._devices()

        blocked = self._blocked()

        def plan(held: Mapping[str, str]) -> PreparedClaim:
            return plan_claim(claim, ref, NodeView(self.driver, self.pool, devices, held, blocked))

        planned = plan(self.state.held())
        # Planned again under the state's lock, so two concurrent Prepares cannot share a device.
        prepared = self.state.add(planned, check=plan)
        self.on_change()
        log.info(
            "claim prepared %s",
            kv(claim=str(ref), devices=",".join(f"{d.device}:{d.milli}" for d in prepared.devices)),
        )
        return prepared

    def unprepare(self, refs: Iterable[ClaimRef]) -> dict[str, str]:
        """UID → "" once the claim is not prepared here (whether or not it was), else the reason."""
        out: dict[str, str] = {}
        for ref in refs:
            try:
                if self.state.remove(ref.uid):
                    log.info("claim unprepared %s", kv(claim=str(ref)))
                    self.on_change()
                out[ref.uid] = ""
            except OSError as exc:
                out[ref.uid] = f"unpreparing claim {ref}: {exc}"
        return out
