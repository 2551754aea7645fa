"""Applies what one reconcile pass decided, action by action, in list order.

The pass is level-triggered: it returns the whole desired state every time. The applier turns
that into as few writes as possible and remembers only what it takes to do so:

- the device list each share plugin advertises, and each spot device's health: a list
  already pushed is not pushed again (every push wakes every ListAndWatch stream);
- which Events it wrote: the same Event on the same pod (or on the node) is written again
  only after ``EVENT_REPEAT_S`` (kubectl shows the count), and at most ``EVENTS_PER_PASS``
  new ones in one pass;
- the pods it evicted: the last ``EVICTIONS_KEPT`` and a count per reason since start.

Creating and deleting shadows asks ``is_leader`` again right before the call: the Lease may
have moved since the pass was planned. A failing action is logged and skipped, whatever it
raises, and the next pass plans it again; it never costs the actions after it.

Shadow creations, deletions and annotations that follow one another in the list (a run of
one kind) are sent ``WRITES_IN_FLIGHT`` at a time: a burst of sharers can ask for thousands of
shadows in one pass, and each sharer waits for its shadow, so one POST after another would
put the last shadow a whole round trip per shadow behind the first; the same holds for idle
shadows marked and deleted by the thousand. The writes of a run are independent of each
other (a shadow's name is deterministic and a repeated create is AlreadyExists; deletions
carry a uid precondition; annotations are merge-patches of distinct keys), and the actions
after a run still start only after all of it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, Protocol

from controller.core.actions import (
    Action,
    AnnotatePod,
    CreateShadow,
    DeleteShadow,
    Evict,
    KillPods,
    KmodCommand,
    PublishCapacity,
    RecordEvent,
    RecordNodeEvent,
    SetDevices,
    SetSpotHealth,
)
from controller.core.pod_facts import PodRef
from controller.io.state import StateStore
from controller.report import Eviction
from controller.spot.hooks import SpotHooks
from deviceplugins import AdvertisedDevice
from gpushare import keys
from gpushare.errors import GpushareError
from gpushare.log import kv

log = logging.getLogger(__name__)

# An Event already written is written again only after this long (kubectl shows the count).
EVENT_REPEAT_S = 600.0
EVICTIONS_KEPT = 50
# Events remembered for de-duplication; past this the oldest half is forgotten (a repeat is harmless).
EVENTS_REMEMBERED = 4096
# New Events written per pass at most: thousands of tenant pods owed a Warning must not turn one
# pass into thousands of API calls. The plans ask again every pass, so the rest follow later.
EVENTS_PER_PASS = 50
# Writes of one run in flight at once. The API server answers many at a time; past a handful
# the gain is small and a burst would only crowd the connection pool the watches also use.
WRITES_IN_FLIGHT = 8
# The actions a run may send concurrently: each is one independent API write.
_CONCURRENT = (CreateShadow, DeleteShadow, AnnotatePod)


class DevicePlugins(Protocol):
    """What the loop and the applier need of the node's devices: ``deviceplugins.PluginManager``, or on
    a DRA node ``controller.io.dra_devices.DraDevices``."""

    def set_devices(self, resource: str, devices: Iterable[Any]) -> None: ...
    def set_spot_health(self, real_id: str, healthy: bool) -> None: ...
    def set_spot_lent(self, real_ids: Iterable[str]) -> None: ...
    def real_devices(self) -> dict[str, tuple[str, ...]]: ...
    def set_real_devices(self, real_resource: str, devices: Iterable[Any]) -> None: ...
    def vendor_unhealthy(self) -> dict[str, str]: ...
    def status(self) -> dict[str, dict[str, Any]]: ...


class PodWriter(Protocol):
    """The writes the applier makes through ``KubeClient``."""

    def create_pod(self, manifest: Mapping[str, Any]) -> Mapping[str, Any] | None: ...
    def delete_pod(self, ref: PodRef) -> bool: ...
    def patch_pod_annotations(self, ref: PodRef, annotations: Mapping[str, str | None]) -> bool: ...
    def record_event(
        self, ref: PodRef, reason: str, message: str, *, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None: ...
    def record_node_event(
        self, node: str, reason: str, message: str, *, type_: Literal["Normal", "Warning"] = "Normal"
    ) -> None: ...


# Lowers this node's count of a share resource (never raises it); True if it wrote. The agent's
# is its Node watch's (controller/share/node_watch.py), which reads the Node it last saw, not a GET.
LowerCapacity = Callable[[str, int], bool]


class Applier:
    """Owned by the loop thread; ``evictions()`` and ``evictions_total()`` copy what it recorded."""

    def __init__(
        self,
        *,
        client: PodWriter,
        plugins: DevicePlugins,
        spot: SpotHooks | None,
        is_leader: Callable[[], bool],
        store: Callable[[], StateStore | None] = lambda: None,
        node_name: str = "",
        capacity: LowerCapacity | None = None,
        offered: Callable[[str, int], None] | None = None,
        created: Callable[[Mapping[str, Any]], None] = lambda _pod: None,
    ) -> None:
        self._client = client
        self._node_name = node_name  # the Node that RecordNodeEvent writes on
        self._capacity = capacity  # None: PublishCapacity has nothing to write with
        # Told the Healthy count of every share list it sets: a rising one is published as soon as
        # kubelet holds it (controller/share/count_catch_up.py).
        self._offered = offered
        # Told each shadow as the API server stored it: the loop's shadow cache holds it before
        # its watch does (controller/io/pod_cache.py, ``PodCache.assume``).
        self._created = created
        self._plugins = plugins
        self._spot = spot
        self._is_leader = is_leader
        self._store = store  # the loop thread opens the store after this is built
        self._advertised: dict[str, tuple[str, ...]] = {}
        self._unhealthy: dict[str, tuple[str, ...]] = {}
        self._spot_health: dict[str, bool] = {}
        self._events_written: dict[tuple[str, str, str], float] = {}
        self._event_budget = (float("nan"), EVENTS_PER_PASS)  # (the pass's ``now``, Events it may still write)
        self._evictions: collections.deque[Eviction] = collections.deque(maxlen=EVICTIONS_KEPT)
        self._evictions_total: collections.Counter[str] = collections.Counter()

    def evictions(self) -> tuple[Eviction, ...]:
        return tuple(self._evictions)

    def evictions_total(self) -> dict[str, int]:
        return dict(self._evictions_total)

    def apply_all(self, actions: Sequence[Action], now: float) -> None:
        """Apply a pass's actions in order; a run of one concurrent kind goes out at once."""
        i = 0
        while i < len(actions):
            kind = type(actions[i])
            j = i + 1
            if kind in _CONCURRENT:
                while j < len(actions) and type(actions[j]) is kind:
                    j += 1
            if j - i > 1:
                self._apply_concurrently(actions[i:j], now)
            else:
                self.apply(actions[i], now)
            i = j

    def _apply_concurrently(self, actions: Sequence[Action], now: float) -> None:
        workers = min(WRITES_IN_FLIGHT, len(actions))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpushare-write") as pool:
            # ``apply`` logs and swallows each failure, so no future raises.
            list(pool.map(lambda action: self.apply(action, now), actions))

    def apply(self, action: Action, now: float) -> None:
        """Apply one action and log the decision; a failure is logged and the pass goes on."""
        try:
            if not self._dispatch(action, now):
                return
        except GpushareError as exc:
            log.warning("action failed; retried next pass", extra=kv(**action.log_fields(), error=str(exc)))
            return
        except Exception:
            # One action is the unit of isolation, as a thread loop is elsewhere: a bug that one
            # action's values trigger must not cost the actions after it in this pass.
            log.exception("action raised; skipped, retried next pass", extra=kv(**action.log_fields()))
            return
        log.info("decision", extra=kv(**action.log_fields()))

    def _dispatch(self, action: Action, now: float) -> bool:
        """False when there was nothing to do (already applied, not leader, nothing wired in)."""
        match action:
            case SetDevices():
                return self._set_devices(action)
            case PublishCapacity():
                return self._capacity is not None and self._capacity(action.resource, action.count)
            case SetSpotHealth():
                return self._set_spot_health(action)
            case CreateShadow():
                return self._create_shadow(action)
            case DeleteShadow():
                if not self._is_leader():
                    return False
                self._client.delete_pod(action.ref)
            case Evict():
                self._evict(action, now)
            case KillPods():
                if self._spot is None:
                    log.warning("no killer wired in; pods left running", extra=kv(**action.log_fields()))
                    return False
                self._spot.killer(action)
            case KmodCommand():
                if self._spot is None:
                    return False
                self._spot.kmod(action)
            case AnnotatePod():
                if action.key == keys.ANNOTATION_SHADOW_DRAINING and not self._is_leader():
                    return False  # marking a shadow for removal is cluster-wide work, like deleting it
                self._client.patch_pod_annotations(action.ref, {action.key: action.value})
            case RecordEvent():
                if not self._is_new_event(action.ref.uid, action.reason, action.message, now):
                    return False
                self._client.record_event(action.ref, action.reason, action.message, type_=action.type)
            case RecordNodeEvent():
                node = self._node_name
                if not node or not self._is_new_event(f"node/{node}", action.reason, action.message, now):
                    return False
                self._client.record_node_event(node, action.reason, action.message, type_=action.type)
        return True

    def _set_devices(self, action: SetDevices) -> bool:
        if self._advertised.get(action.resource) == action.ids and self._unhealthy.get(action.resource, ()) == (
            action.unhealthy
        ):
            return False
        before = self._advertised.get(action.resource)
        sick = frozenset(action.unhealthy)
        self._plugins.set_devices(action.resource, [AdvertisedDevice(i, i not in sick) for i in action.ids])
        self._advertised[action.resource] = action.ids
        self._unhealthy[action.resource] = action.unhealthy
        if self._offered is not None:
            self._offered(action.resource, len(set(action.ids) - sick))
        if before is not None and len(action.ids) < len(before) and self._capacity is not None:
            # Devices that went without a drain (a shadow deleted by hand, or gone): the scheduler
            # would offer them until kubelet's next node status, so publish the count at once.
            try:
                self._capacity(action.resource, len(action.ids))
            except GpushareError as exc:
                log.warning("cannot publish the lower count", extra=kv(resource=action.resource, error=str(exc)))
        return True

    def _set_spot_health(self, action: SetSpotHealth) -> bool:
        if self._spot_health.get(action.real_id) == action.is_healthy:
            return False
        self._plugins.set_spot_health(action.real_id, action.is_healthy)
        self._spot_health[action.real_id] = action.is_healthy
        return True

    def _create_shadow(self, action: CreateShadow) -> bool:
        if not self._is_leader():
            return False
        stored = self._client.create_pod(action.manifest)
        if stored is None:
            log.info("shadow already exists", extra=kv(shadow=action.name))
        else:
            self._created(stored)
        return True

    def _is_new_event(self, about: str, reason: str, message: str, now: float) -> bool:
        """``about``: the pod's uid, or ``node/<name>``."""
        key = (about, reason, message)
        last = self._events_written.get(key)
        if last is not None and now - last < EVENT_REPEAT_S:
            return False
        # A pass applies all its actions with one ``now``: a new one starts a new budget.
        at, left = self._event_budget if self._event_budget[0] == now else (now, EVENTS_PER_PASS)
        if left <= 0:
            return False  # not remembered as written: the next pass asks again
        self._event_budget = (at, left - 1)
        self._events_written[key] = now
        if len(self._events_written) > EVENTS_REMEMBERED:
            oldest = sorted(self._events_written.items(), key=lambda item: item[1])[: EVENTS_REMEMBERED // 2]
            for k, _ in oldest:
                del self._events_written[k]
        return True

    def _evict(self, action: Evict, now: float) -> None:
        if not self._client.delete_pod(action.ref):
            return  # already gone or replaced: nothing was evicted
        self._evictions.append(Eviction(now, action.ref.key, action.reason, action.message))
        self._evictions_total[action.reason] += 1
        store = self._store()
        if store is not None:
            with contextlib.suppress(GpushareError):
                store.add_counter("evictions", action.reason)
        with contextlib.suppress(GpushareError):
            self._client.record_event(action.ref, action.reason, action.message, type_="Warning")


__all__ = [
    "EVENTS_PER_PASS",
    "EVENT_REPEAT_S",
    "EVICTIONS_KEPT",
    "WRITES_IN_FLIGHT",
    "Applier",
    "DevicePlugins",
    "PodWriter",
]
