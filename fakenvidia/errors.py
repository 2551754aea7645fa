"""The fake driver's errors.

    GpushareError
     └── FakeNvidiaError     a fake could not be built or configured; the message says which and why

Rooted in the shared leaf like every error of ours, so one ``except GpushareError`` catches it too.
"""

from __future__ import annotations

from gpushare.errors import GpushareError


class FakeNvidiaError(GpushareError):
    """The C did not build, a configuration was refused, or a driver root could not be made."""
