"""Errors of the controller and the agent.

GpushareError
└── ControllerError
    ├── RetryLater              a transient failure: the same step may succeed when tried again
    ├── KubeError               the API server refused or could not be reached
    │   ├── ResourceExpired     a watch or list resourceVersion is too old (410): list again
    │   └── ApiUnavailable      unreachable, timed out, 429 or 5xx (also a RetryLater)
    ├── InvalidObject           a pod from the API lacks a field the controller needs (skipped)
    └── StateError              the state file under stateDir cannot be opened or is too new

The parts the agent uses have trees of their own: ``gpumetrics.errors.MetricsError``,
``podcgroups.errors.ProcessError``.
"""

from __future__ import annotations

from gpushare.errors import GpushareError


class ControllerError(GpushareError):
    """Base of the controller's errors."""


class RetryLater(ControllerError):
    """Transient: the same step may succeed when tried again (kopf's TemporaryError)."""


class KubeError(ControllerError):
    """The API server answered with an error or was unreachable; the message names the call."""


class InvalidObject(ControllerError):
    """An API object cannot be read as the model needs it; the message names the pod and field.

    ``field`` names the part that could not be read in a fixed word (the ``field`` label of
    ``gpushare_pod_input_errors_total``), never its value; "" when not known.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class StateError(ControllerError):
    """The SQLite state file could not be used; the message names the path and what to do."""


class ResourceExpired(KubeError):
    """HTTP 410: the resourceVersion a watch resumed from is gone; the caller lists again."""


class ApiUnavailable(KubeError, RetryLater):
    """The API server did not answer in time, could not be reached, or asked us to back off."""
