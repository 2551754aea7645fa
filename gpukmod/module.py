"""Build, load, unload and the versioned idempotent install of gpukmod.ko (design §7).

``plan_install`` is the decision (pure); ``install`` carries it out: an identical loaded
version is left alone, a different one is replaced, and the load is verified by reading
the version back from sysfs.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from enum import Enum
from pathlib import Path

from gpukmod._transport import ModuleOps, module_ops
from gpukmod.errors import KmodError
from gpukmod.protocol import elf_section, parse_modinfo

log = logging.getLogger(__name__)

MODULE_NAME = "gpukmod"
SOURCE_DIR = Path(__file__).resolve().parent / "kmod"
SOURCE_FILES = ("gpukmod.c", "Kbuild", "Makefile", "VERSION")
DEFAULT_BUILD_ROOT = Path("/var/lib/gpushare/kmod")


class InstallAction(Enum):
    """What ``install`` does, given what is loaded."""

    KEEP = "keep"  # the same version is loaded: leave it alone
    LOAD = "load"  # nothing loaded
    REPLACE = "replace"  # another version is loaded: unload it, then load ours


def plan_install(loaded: str | None, candidate: str) -> InstallAction:
    """Decide the install step from the loaded version (``None``: not loaded) and ours."""
    if loaded is None:
        return InstallAction.LOAD
    return InstallAction.KEEP if loaded == candidate else InstallAction.REPLACE


def source_version() -> str:
    """The version the module source in this package declares (``kmod/VERSION``)."""
    return (SOURCE_DIR / "VERSION").read_text().strip()


def ko_version(path: Path) -> str:
    """The ``MODULE_VERSION`` recorded in a built ``.ko``."""
    try:
        info = parse_modinfo(elf_section(path.read_bytes(), ".modinfo"))
    except FileNotFoundError as exc:
        raise KmodError(errno.ENOENT, "load", str(path)) from exc
    except ValueError as exc:
        raise KmodError(errno.ENOEXEC, "load", f"{path}: {exc}") from exc
    if "version" not in info:
        raise KmodError(errno.ENOEXEC, "load", f"{path} has no MODULE_VERSION")
    return info["version"]


def format_params(max_block_ms: int | None = None, unit: int | None = None) -> str:
    """The module parameter string for ``finit_module``."""
    parts = []
    if max_block_ms is not None:
        parts.append(f"max_block_ms={int(max_block_ms)}")
    if unit is not None:
        parts.append(f"nl_unit={int(unit)}")
    return " ".join(parts)


def default_kernel_dir(release: str | None = None) -> Path:
    """The running (or named) kernel's headers: ``/lib/modules/<release>/build``."""
    return Path("/lib/modules") / (release or os.uname().release) / "build"


def default_ko_path(release: str | None = None) -> Path:
    """Where ``install`` puts the module for a kernel release."""
    return DEFAULT_BUILD_ROOT / (release or os.uname().release) / f"{MODULE_NAME}.ko"


def build_module(kernel_dir: Path, out_dir: Path, version: str | None = None, *, werror: bool = True) -> Path:
    """Build gpukmod.ko against ``kernel_dir`` in ``out_dir`` (sources are copied there first).

    ``version`` overrides ``kmod/VERSION`` (tests build a second version this way). With
    ``werror``, a compiler warning fails the build: a module that warns today breaks later.
    """
    if not (kernel_dir / "Makefile").exists():
        raise KmodError(
            errno.ENOENT,
            "build",
            f"no kernel headers at {kernel_dir}; install linux-headers-$(uname -r) or pass --kernel-dir",
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SOURCE_FILES:
        shutil.copyfile(SOURCE_DIR / name, out_dir / name)
    cmd = ["make", "-s", "-C", str(out_dir), f"KDIR={kernel_dir}"]
    if version:
        cmd.append(f"GPUKMOD_VERSION={version}")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    (out_dir / "build.log").write_text(output)
    if proc.returncode != 0:
        raise KmodError(errno.ENOEXEC, "build", f"make failed, see {out_dir / 'build.log'}:\n{output[-2000:]}")
    warnings = [line for line in output.splitlines() if "warning:" in line]
    if werror and warnings:
        raise KmodError(errno.ENOEXEC, "build", "compiler warnings:\n" + "\n".join(warnings[:20]))
    return out_dir / f"{MODULE_NAME}.ko"


def loaded_version(ops: ModuleOps | None = None) -> str | None:
    """The loaded module's version, or ``None`` if it is not loaded."""
    return (ops or module_ops()).version(MODULE_NAME)


def load(ko: Path, params: str = "", ops: ModuleOps | None = None) -> None:
    """``finit_module`` the ``.ko`` with ``params``."""
    (ops or module_ops()).load(str(ko), params)


def unload(ops: ModuleOps | None = None) -> None:
    """``delete_module``; ``KmodError(EAGAIN)`` while a netlink socket on its unit is open."""
    (ops or module_ops()).unload(MODULE_NAME)


def install(ko: Path, params: str = "", ops: ModuleOps | None = None) -> InstallAction:
    """Load ``ko`` unless the same version is loaded; replace another version; verify."""
    ops = ops or module_ops()
    candidate = ko_version(ko)
    loaded = ops.version(MODULE_NAME)
    action = plan_install(loaded, candidate)
    if action is InstallAction.REPLACE:
        ops.unload(MODULE_NAME)
    if action is not InstallAction.KEEP:
        ops.load(str(ko), params)
        now = ops.version(MODULE_NAME)
        if now != candidate:
            raise KmodError(errno.EIO, "install", f"loaded {ko} but sysfs reports version {now!r}, not {candidate!r}")
    log.info(
        "gpukmod install",
        extra={"decision": action.value, "loaded_before": loaded, "version": candidate, "ko": str(ko)},
    )
    return action
