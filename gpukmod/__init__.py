"""gpukmod: the GPU-ioctl watching kernel module, its helper and the Python client (design §7).

- ``KmodClient``: register, add/delete/detect/undetect/release, ``watch``, notices.
- ``install``/``load``/``unload``/``loaded_version``/``build_module``: the module itself.
- ``KmodError``: every failure, with the errno, the operation and what to do.
"""

from gpukmod.client import KmodClient
from gpukmod.errors import KmodError, KmodUnavailable
from gpukmod.module import (
    InstallAction,
    build_module,
    install,
    load,
    loaded_version,
    plan_install,
    unload,
)

__all__ = [
    "InstallAction",
    "KmodClient",
    "KmodError",
    "KmodUnavailable",
    "build_module",
    "install",
    "load",
    "loaded_version",
    "plan_install",
    "unload",
]
