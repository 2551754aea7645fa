"""Errors of the device plugins, rooted at ``gpushare.errors.GpushareError``.

    GpushareError
    └── DevicePluginError                 anything the device plugins refuse or fail at
        ├── UnknownDevices(ids)           Allocate named IDs this plugin never advertised
        ├── DevicesRefused(ids, reason)   Allocate named IDs we advertise but cannot hand out
        │                                 (an Unhealthy spot device, slots of two shadows)
        ├── SocketError(path)             serving, dialling or removing a unix socket failed
        │   └── SocketReplaced(path)      our socket vanished while kubelet was dialling it
        ├── RegistrationFailed(resource)  kubelet refused or did not answer Register
        ├── FakeDeviceError(path)         the fake vendor plugin could not create its nodes
        └── InvalidShadow(problems)       a shadow handed in cannot be advertised

gRPC errors and ``OSError`` are translated into these once, where they happen, with the
cause chained. Decision code (``policies.py``) raises only ``UnknownDevices`` and
``DevicesRefused``; the servers turn them into a gRPC status whose message is the same text
(kubelet shows it in the pod's ``UnexpectedAdmissionError``).
"""

from __future__ import annotations

from collections.abc import Iterable

from gpushare.errors import GpushareError


class DevicePluginError(GpushareError):
    """Base of every device-plugin error."""


class UnknownDevices(DevicePluginError):
    """Allocate asked for IDs this plugin does not advertise (stale kubelet state or a bug)."""

    def __init__(self, resource: str, ids: Iterable[str]) -> None:
        self.resource = resource
        self.ids = tuple(sorted(ids))
        super().__init__(
            f"gpushare: {resource}: unknown device ID(s) {', '.join(self.ids)}; this plugin does not advertise "
            "them (the device list changed after kubelet chose them: retry the pod)"
        )


class DevicesRefused(DevicePluginError):
    """Allocate asked for IDs we advertise but must not hand out; ``reason`` says why."""

    def __init__(self, resource: str, ids: Iterable[str], reason: str) -> None:
        self.resource = resource
        self.ids = tuple(sorted(ids))
        self.reason = reason
        super().__init__(f"gpushare: {resource}: refused device ID(s) {', '.join(self.ids)}: {reason}")


class SocketError(DevicePluginError):
    """A unix socket could not be served, dialled or removed; the message names the path."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"gpushare: socket {path}: {reason}")


class SocketReplaced(SocketError):
    """Our socket was deleted (a starting kubelet wipes the directory) during Register: serve again now."""


class RegistrationFailed(DevicePluginError):
    """kubelet refused the Register call or did not answer it in time."""

    def __init__(self, resource: str, kubelet_socket: str, reason: str) -> None:
        self.resource = resource
        super().__init__(
            f"gpushare: registering {resource} with kubelet at {kubelet_socket} failed: {reason}; "
            "is kubelet running and is kubelet.devicePluginDir its device-plugin directory?"
        )


class FakeDeviceError(DevicePluginError):
    """The fake vendor plugin could not create or reuse a device node."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"gpushare: fake GPU node {path}: {reason}")


class InvalidShadow(DevicePluginError):
    """``set_shadows`` or ``--shadow`` was handed a shadow we cannot advertise; nothing changed."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"gpushare: shadows refused, {len(self.problems)} problem(s), nothing changed:\n{lines}")
