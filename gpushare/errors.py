"""The root of every error gpushare raises, and the errors of the shared contract.

    GpushareError
    ├── ConfigError(problems)            config file or flag refused
    └── InstructionRefused(reason)       an annotation we must not act on (design §8)

Each part adds its own subtree in its ``errors.py`` (``TransportError`` in
``nri_plugin``, ``DevicePluginError``, ``KmodError``, ``ControllerError``), always
rooted here, so a caller can catch everything of ours with one ``except``.
"""

from __future__ import annotations


class GpushareError(Exception):
    """Base of every gpushare error. The message says what happened and what to do."""


class ConfigError(GpushareError):
    """The configuration was refused. ``problems`` lists ``key: reason (got X)`` lines."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"gpushare: {source} refused, {len(self.problems)} problem(s):\n{lines}")


# Why the NRI plugin refused a container, as a fixed word an operator can count and graph
# (``gpushare_nri_refusals_total{reason}``); the message says the rest.
REFUSED_MALFORMED = "malformed"  # an annotation that does not parse or breaks its own format
REFUSED_FORGED = "forged"  # a cross-pod instruction where only the device plugin may write one
REFUSED_CONFLICT = "conflict"  # two sources for one container, or a device it already has differently
REFUSED_UNCONFIRMED = "unconfirmed"  # kubelet's PodResources does not (or cannot) confirm the allocation
REFUSED_NOT_READY = "not-ready"  # the source container or pod is not created on this node yet
REFUSED_NOT_SHADOW = "not-shadow"  # a cross-pod source that is not a gpushare shadow
REFUSED_LEND_ENDED = "lend-ended"  # a spot GPU whose lend ended or cannot be confirmed active
REFUSED_DEVICES_UNKNOWN = "devices-unknown"  # the GPU's device nodes cannot be told apart or found
REFUSED_MIX = "mix"  # a pod whose mix of GPU requests gpushare refuses (rules.refused_mix), or one not read yet
REFUSAL_REASONS = (
    REFUSED_MALFORMED,
    REFUSED_FORGED,
    REFUSED_CONFLICT,
    REFUSED_UNCONFIRMED,
    REFUSED_NOT_READY,
    REFUSED_NOT_SHADOW,
    REFUSED_LEND_ENDED,
    REFUSED_DEVICES_UNKNOWN,
    REFUSED_MIX,
)


class InstructionRefused(GpushareError):
    """An injection instruction (annotation) is malformed or breaks a trust rule.

    The message is shown to the user through the failed CreateContainer, so it names the
    annotation, the bad value and the rule; ``reason`` is one of ``REFUSAL_REASONS``.
    """

    def __init__(self, message: str, *, reason: str = REFUSED_MALFORMED) -> None:
        super().__init__(message)
        self.reason = reason
