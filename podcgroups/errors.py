"""podcgroups errors.

    GpushareError
    └── ProcessError          a host process fact (/proc, cgroupfs) could not be read or acted on
        ├── KillTimeout       a cgroup's tasks outlived the kill bound (a task stuck in D state)
        └── ExitBoostJournalError  the CPU weights journal of an earlier run is unusable or names other files

Every ``OSError`` from ``/proc`` or cgroupfs is translated once, where it is read, into a
``ProcessError`` that names the path; a cgroup that is gone is not an error (its tasks are).
"""

from __future__ import annotations

from gpushare.errors import GpushareError


class ProcessError(GpushareError):
    """A host process fact (``/proc``, cgroupfs) could not be read or acted on; names the path."""


class KillTimeout(ProcessError):
    """SIGKILL did not empty a cgroup in time (a task stuck in the kernel, D state)."""


class ExitBoostJournalError(ProcessError):
    """The CPU weight journal of an earlier run is not one, or names files that are no raised weight."""
