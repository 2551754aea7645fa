"""Build, load, unload and the versioned idempotent install of gpukmod.ko (design §7).

``plan_install`` is the decision (pure); ``install`` carries it out: an identical loaded
version is left alone, a different one is replaced, and the load is verified by reading
the version back from sysfs.

``read_kernel_facts`` records what decides whether the module can be built and loaded on
this machine at all (headers, module support, CAP_SYS_MODULE, lockdown, Secure Boot,
signature enforcement); ``plan_optional_install`` and ``refusal_reason`` are the pure
decisions behind ``gpushare kmod install --best-effort``, where a node that cannot have the
module is a normal state (spot then sees owners return by utilization alone), not an error.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
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


# --- can this machine have the module at all? -------------------------------------------------------

SECURE_BOOT_VAR = Path("/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c")
LOCKDOWN_FILE = Path("/sys/kernel/security/lockdown")
SIG_ENFORCE_FILE = Path("/sys/module/module/parameters/sig_enforce")
MODULES_DISABLED_FILE = Path("/proc/sys/kernel/modules_disabled")
PROC_MODULES = Path("/proc/modules")
PROC_STATUS = Path("/proc/self/status")
CAP_SYS_MODULE = 16
# Lockdown modes that refuse a module without a valid signature (LOCKDOWN_MODULE_SIGNATURE).
_REFUSING_LOCKDOWN = ("integrity", "confidentiality")
# What finit_module answers when the kernel refuses an unsigned or badly signed module.
_SIGNATURE_ERRNOS = (errno.EKEYREJECTED, errno.ENOKEY, errno.EBADMSG)


@dataclass(frozen=True)
class KernelFacts:
    """What decides whether gpukmod can be built and loaded here, as read; ``None``: not readable here.

    Text is kept as the kernel wrote it, so a unit test replays a machine from recorded files.
    """

    release: str
    kernel_dir: str
    headers: bool  # <kernel_dir>/Makefile exists
    loaded: str | None  # /sys/module/gpukmod/version
    modules: bool  # /proc/modules exists: the kernel was built with module support
    modules_disabled: str | None  # /proc/sys/kernel/modules_disabled ("1": loading is off until reboot)
    cap_eff: str | None  # the CapEff line of /proc/self/status (hex)
    lockdown: str | None  # /sys/kernel/security/lockdown, e.g. "none [integrity] confidentiality"
    sig_enforce: str | None  # /sys/module/module/parameters/sig_enforce ("Y"/"N")
    secure_boot: bytes | None  # the EFI SecureBoot variable: 4 attribute bytes, then 1 = on


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cap_eff(status: str | None) -> str | None:
    for line in (status or "").splitlines():
        if line.startswith("CapEff:"):
            return line.split(":", 1)[1].strip()
    return None


def read_kernel_facts(kernel_dir: Path | None = None, ops: ModuleOps | None = None) -> KernelFacts:
    """Read the facts of the running kernel; nothing is changed and nothing here raises."""
    release = os.uname().release
    kdir = kernel_dir or default_kernel_dir(release)
    try:
        loaded = loaded_version(ops)
    except KmodError:
        loaded = None
    try:
        secure_boot: bytes | None = SECURE_BOOT_VAR.read_bytes()
    except OSError:
        secure_boot = None
    return KernelFacts(
        release=release,
        kernel_dir=str(kdir),
        headers=(kdir / "Makefile").exists(),
        loaded=loaded,
        modules=PROC_MODULES.exists(),
        modules_disabled=_read_text(MODULES_DISABLED_FILE),
        cap_eff=_cap_eff(_read_text(PROC_STATUS)),
        lockdown=_read_text(LOCKDOWN_FILE),
        sig_enforce=_read_text(SIG_ENFORCE_FILE),
        secure_boot=secure_boot,
    )


def lockdown_mode(text: str | None) -> str | None:
    """The selected mode of ``/sys/kernel/security/lockdown`` (the one in brackets), or ``None``."""
    if not text or "[" not in text:
        return None
    mode = text.split("[", 1)[1].split("]", 1)[0].strip()
    return mode or None


def secure_boot_on(raw: bytes | None) -> bool | None:
    """The EFI SecureBoot variable's value (after its 4 attribute bytes); ``None`` when unknown."""
    if raw is None or len(raw) < 5:
        return None
    return raw[4] == 1


def has_capability(cap_eff: str | None, bit: int) -> bool | None:
    """Whether the hex capability mask has ``bit``; ``None`` when the mask is unknown or not hex."""
    try:
        return bool(int(cap_eff or "", 16) >> bit & 1) if cap_eff else None
    except ValueError:
        return None


def _secure_boot_note(facts: KernelFacts) -> str:
    on = secure_boot_on(facts.secure_boot)
    return "Secure Boot is on" if on else ("Secure Boot is off" if on is False else "Secure Boot state unknown")


def load_blocker(facts: KernelFacts) -> str | None:
    """Why no unsigned module can be loaded here, or ``None`` when nothing known stops it."""
    if not facts.modules:
        return f"the running kernel {facts.release} was built without loadable module support"
    if facts.modules_disabled == "1":
        return "module loading is switched off until reboot (kernel.modules_disabled = 1)"
    if has_capability(facts.cap_eff, CAP_SYS_MODULE) is False:
        return "this process lacks CAP_SYS_MODULE (the kmod init container must run privileged)"
    mode = lockdown_mode(facts.lockdown)
    if mode in _REFUSING_LOCKDOWN:
        return (
            f"kernel lockdown is {mode!r} ({_secure_boot_note(facts)}), which refuses unsigned modules, "
            "and gpukmod is built unsigned"
        )
    if (facts.sig_enforce or "").upper() in ("Y", "1"):
        note = _secure_boot_note(facts)
        return f"module signatures are enforced (module.sig_enforce=Y, {note}) and gpukmod is built unsigned"
    return None


def build_blocker(facts: KernelFacts) -> str | None:
    """Why the module cannot be built here, or ``None`` when the headers are in place."""
    if facts.headers:
        return None
    return (
        f"no kernel headers for the running kernel {facts.release} at {facts.kernel_dir} "
        f"(install linux-headers-{facts.release} on the node)"
    )


class OptionalStep(Enum):
    """What ``install --best-effort`` does."""

    KEEP = "keep"  # our version is already loaded: nothing to build or load
    SKIP = "skip"  # the module cannot be had here: say why and go on without it
    INSTALL = "install"  # build (unless a .ko is given) and install as usual


def plan_optional_install(facts: KernelFacts, candidate: str, *, building: bool) -> tuple[OptionalStep, str]:
    """The best-effort decision and its reason; ``building``: no ready ``.ko`` was given."""
    if facts.loaded is not None and facts.loaded == candidate:
        return OptionalStep.KEEP, f"version {candidate} is already loaded"
    reasons = [r for r in (load_blocker(facts), build_blocker(facts) if building else None) if r]
    if reasons:
        return OptionalStep.SKIP, ", and ".join(reasons)
    return OptionalStep.INSTALL, ""


def refusal_reason(exc: KmodError, facts: KernelFacts | None = None) -> str:
    """One line saying why a build or load failed, naming Secure Boot where the errno means it."""
    if exc.op == "load" and exc.errno in _SIGNATURE_ERRNOS:
        note = f", {_secure_boot_note(facts)}" if facts is not None else ""
        return f"the kernel rejected gpukmod's missing signature (module signing is enforced{note})"
    if exc.op == "load" and exc.errno == errno.EPERM:
        mode = lockdown_mode(facts.lockdown) if facts is not None else None
        where = f"kernel lockdown is {mode!r}" if mode and mode != "none" else "no CAP_SYS_MODULE, or a lockdown"
        return f"the kernel refused to load gpukmod (EPERM: {where})"
    first = str(exc).splitlines()[0].rstrip(":") if str(exc) else repr(exc)
    return first.removeprefix("gpukmod: ")
