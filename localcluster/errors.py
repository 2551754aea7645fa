"""The cluster's errors.

    GpushareError
     └── ClusterError            the cluster could not be started, reached or torn down
          └── ClusterUnavailable a binary it needs is not built (the message names the build command)

The containerd pieces raise their own: ``containerd.InstallMissing``, ``containerd.ContainerdError``,
``cri.CriError`` and ``images.ImageBuildError``.
"""

from __future__ import annotations

from gpushare.errors import GpushareError


class ClusterError(GpushareError):
    """The cluster could not be started, reached, or torn down. The message says which part and why."""


class ClusterUnavailable(ClusterError):
    """A binary the cluster needs is not installed; the message names the command that installs it."""
