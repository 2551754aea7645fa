"""Whether this machine can have gpukmod at all: decisions over recorded kernel files (lockdown, EFI, caps)."""

from __future__ import annotations

import dataclasses
import errno
from pathlib import Path

import pytest

from gpukmod import KmodError
from gpukmod import module as m
from gpukmod.module import KernelFacts, OptionalStep

# The files as the kernel writes them: the EFI variable is 4 attribute bytes (0x06: boot and runtime
# access), then the value; the lockdown file brackets the active mode (Debian's kernel picks
# integrity when Secure Boot is on).
SB_ON_EFI = b"\x06\x00\x00\x00\x01"
SB_OFF_EFI = b"\x06\x00\x00\x00\x00"
LOCKED = "none [integrity] confidentiality"
OPEN = "[none] integrity confidentiality"
ROOT_CAPS = "000001ffffffffff"  # every capability
NO_SYS_MODULE = "000001fffffeffff"  # bit 16 (CAP_SYS_MODULE) cleared


def node(**changes: object) -> KernelFacts:
    base = KernelFacts(
        release="6.1.0-50-amd64",
        kernel_dir="/lib/modules/6.1.0-50-amd64/build",
        headers=True,
        loaded=None,
        modules=True,
        modules_disabled="0",
        cap_eff=ROOT_CAPS,
        lockdown=OPEN,
        sig_enforce="N",
        secure_boot=SB_OFF_EFI,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "mode"),
    [(LOCKED, "integrity"), (OPEN, "none"), ("none integrity [confidentiality]\n", "confidentiality"), ("", None)],
)
def test_lockdown_mode(text: str, mode: str | None) -> None:
    assert m.lockdown_mode(text) == mode
    assert m.lockdown_mode(None) is None


@pytest.mark.parametrize(("raw", "on"), [(SB_ON_EFI, True), (SB_OFF_EFI, False), (b"\x06\x00", None), (None, None)])
def test_secure_boot_on(raw: bytes | None, on: bool | None) -> None:
    assert m.secure_boot_on(raw) is on


@pytest.mark.parametrize(("mask", "has"), [(ROOT_CAPS, True), (NO_SYS_MODULE, False), (None, None), ("zz", None)])
def test_has_cap_sys_module(mask: str | None, has: bool | None) -> None:
    assert m.has_capability(mask, m.CAP_SYS_MODULE) is has


# (name, facts, candidate, building, step, words in the reason)
PLANS = [
    ("a normal node", node(), "0.2.0", True, OptionalStep.INSTALL, ()),
    ("our version already there", node(loaded="0.2.0", headers=False), "0.2.0", True, OptionalStep.KEEP, ("0.2.0",)),
    ("another version", node(loaded="0.1.0"), "0.2.0", True, OptionalStep.INSTALL, ()),
    (
        "no headers (this test host's cluster node)",
        node(headers=False),
        "0.2.0",
        True,
        OptionalStep.SKIP,
        ("no kernel headers for the running kernel 6.1.0-50-amd64", "linux-headers-6.1.0-50-amd64"),
    ),
    ("no headers, but a built .ko given", node(headers=False), "0.2.0", False, OptionalStep.INSTALL, ()),
    (
        "Secure Boot locks the kernel down",
        node(lockdown=LOCKED, secure_boot=SB_ON_EFI),
        "0.2.0",
        True,
        OptionalStep.SKIP,
        ("lockdown is 'integrity'", "Secure Boot is on", "unsigned"),
    ),
    (
        "signatures enforced",
        node(sig_enforce="Y", secure_boot=None),
        "0.2.0",
        True,
        OptionalStep.SKIP,
        ("module.sig_enforce=Y", "Secure Boot state unknown"),
    ),
    ("Secure Boot on, kernel not enforcing", node(secure_boot=SB_ON_EFI), "0.2.0", True, OptionalStep.INSTALL, ()),
    (
        "no CAP_SYS_MODULE",
        node(cap_eff=NO_SYS_MODULE),
        "0.2.0",
        True,
        OptionalStep.SKIP,
        ("CAP_SYS_MODULE", "privileged"),
    ),
    (
        "a kernel without modules",
        node(modules=False, headers=False),
        "0.2.0",
        True,
        OptionalStep.SKIP,
        ("without loadable module support",),
    ),
    ("loading switched off", node(modules_disabled="1"), "0.2.0", True, OptionalStep.SKIP, ("modules_disabled",)),
]


@pytest.mark.parametrize(
    ("facts", "candidate", "building", "step", "words"), [p[1:] for p in PLANS], ids=[p[0] for p in PLANS]
)
def test_plan_optional_install(
    facts: KernelFacts, candidate: str, building: bool, step: OptionalStep, words: tuple[str, ...]
) -> None:
    got, reason = m.plan_optional_install(facts, candidate, building=building)
    assert got is step, reason
    for word in words:
        assert word in reason
    assert "\n" not in reason


@pytest.mark.parametrize(
    ("exc", "facts", "words"),
    [
        (
            KmodError(errno.EKEYREJECTED, "load", "/x.ko"),
            node(secure_boot=SB_ON_EFI),
            ("signature", "Secure Boot is on"),
        ),
        (KmodError(errno.ENOKEY, "load", "/x.ko"), None, ("signature",)),
        (KmodError(errno.EPERM, "load", "/x.ko"), node(lockdown=LOCKED), ("EPERM", "lockdown is 'integrity'")),
        (KmodError(errno.EPERM, "load", "/x.ko"), node(), ("EPERM", "CAP_SYS_MODULE")),
        (KmodError(errno.ENOEXEC, "build", "make failed, see /b/build.log:\nerror: x\nmore"), node(), ("make failed",)),
    ],
)
def test_refusal_reason_is_one_line(exc: KmodError, facts: KernelFacts | None, words: tuple[str, ...]) -> None:
    reason = m.refusal_reason(exc, facts)
    assert "\n" not in reason and not reason.startswith("gpukmod: ")
    for word in words:
        assert word in reason, reason


def test_read_kernel_facts_on_recorded_files(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    files = {
        "lockdown": LOCKED + "\n",
        "sig": "N\n",
        "disabled": "0\n",
        "status": f"Name:\tpython\nCapInh:\t0000000000000000\nCapEff:\t{NO_SYS_MODULE}\n",
        "modules": "gpukmod 16384 0 - Live 0x0\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "sb").write_bytes(SB_ON_EFI)
    kdir = tmp_path / "build"
    kdir.mkdir()
    (kdir / "Makefile").write_text("all:\n")
    monkeypatch.setattr(m, "LOCKDOWN_FILE", tmp_path / "lockdown")
    monkeypatch.setattr(m, "SIG_ENFORCE_FILE", tmp_path / "sig")
    monkeypatch.setattr(m, "MODULES_DISABLED_FILE", tmp_path / "disabled")
    monkeypatch.setattr(m, "PROC_STATUS", tmp_path / "status")
    monkeypatch.setattr(m, "PROC_MODULES", tmp_path / "modules")
    monkeypatch.setattr(m, "SECURE_BOOT_VAR", tmp_path / "sb")
    monkeypatch.setattr(m, "loaded_version", lambda ops=None: "0.1.0")
    facts = m.read_kernel_facts(kdir)
    assert facts == dataclasses.replace(
        facts,
        kernel_dir=str(kdir),
        headers=True,
        loaded="0.1.0",
        modules=True,
        modules_disabled="0",
        cap_eff=NO_SYS_MODULE,
        lockdown=LOCKED,
        sig_enforce="N",
        secure_boot=SB_ON_EFI,
    )
    for name in ("lockdown", "sig", "sb", "modules"):
        (tmp_path / name).unlink()
    bare = m.read_kernel_facts(tmp_path / "none")
    assert (bare.headers, bare.modules, bare.lockdown, bare.sig_enforce, bare.secure_boot) == (
        False,
        False,
        None,
        None,
        None,
    )
