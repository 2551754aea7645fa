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


class InstructionRefused(GpushareError):
    """An injection instruction (annotation) is malformed or breaks a trust rule.

    The message is shown to the user through the failed CreateContainer, so it names the
    annotation, the bad value and the rule.
    """
