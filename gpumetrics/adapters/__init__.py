"""One ``GpuAdapter`` per vendor exporter, registered by name (``base.register``).

Importing this package registers every vendor, in the order below: ``adapter_names()`` and
vendor detection follow it.
"""

from gpumetrics.adapters import (  # noqa: F401
    amd,
    ascend,
    biren,
    cambricon,
    enflame,
    hygon,
    iluvatar,
    kunlunxin,
    metax,
    mthreads,
    nvidia,
)
from gpumetrics.adapters.base import GpuAdapter, adapter_names, get_adapter, register

__all__ = ["GpuAdapter", "adapter_names", "get_adapter", "register"]
