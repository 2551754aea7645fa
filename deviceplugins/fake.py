"""Device nodes of the fake vendor plugin (``gpushare fake-gpus``).

Each fake GPU is a character device node ``<dev_dir>/fakegpu<i>``. By default every node
is ``c 1:3``, the numbers of ``/dev/null``: the kernel's mem driver answers ``open`` on
it for anyone with no hardware behind it, so a container given the node can open, write
and read it like a GPU whose driver accepts everything. The price is that all fake GPUs
share one device number and runc's default device-cgroup list already allows ``c 1:3``;
tests therefore tell fake GPUs apart by *path* (is ``/dev/fakegpu1`` present in the
container?), not by the cgroup. ``--major/--minor`` choose other numbers when a test needs
cgroup enforcement (for instance ``c 1:11``, ``/dev/kmsg``, which runc does not allow by default).
"""

from __future__ import annotations

import os
import stat

from deviceplugins.errors import FakeDeviceError
from deviceplugins.policies import fake_device_ids

DEFAULT_MAJOR = 1
DEFAULT_MINOR = 3


def create_fake_gpu_nodes(
    dev_dir: str, count: int, major: int = DEFAULT_MAJOR, minor: int = DEFAULT_MINOR
) -> list[str]:
    """Create (or keep, if already right) ``count`` nodes; return their paths.

    A path that exists but is not ``c major:minor`` is an error and nothing is changed.
    """
    if count < 1:
        raise FakeDeviceError(dev_dir, f"--count must be at least 1 (got {count})")
    paths = [os.path.join(dev_dir, name) for name in fake_device_ids(count)]
    want = os.makedev(major, minor)
    for path in paths:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise FakeDeviceError(path, f"cannot inspect ({exc.strerror})") from exc
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != want:
            raise FakeDeviceError(
                path,
                f"exists but is not a character device {major}:{minor}; remove it or choose another --dev-dir",
            )
    try:
        os.makedirs(dev_dir, exist_ok=True)
    except OSError as exc:
        raise FakeDeviceError(dev_dir, f"cannot create the directory ({exc.strerror})") from exc
    for path in paths:
        if os.path.exists(path):
            continue
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, want)
            os.chmod(path, 0o666)  # mknod honours the umask
        except PermissionError as exc:
            raise FakeDeviceError(path, "mknod needs root (CAP_MKNOD)") from exc
        except OSError as exc:
            raise FakeDeviceError(path, f"mknod failed ({exc.strerror})") from exc
    return paths
