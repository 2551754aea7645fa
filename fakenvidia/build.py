"""Compiling the fake driver's C with the system ``cc``: the mock NVML, the stub libraries, the stub tool.

Each artifact is built once per content: its directory under the output root (by default the
repository's git-ignored ``build/fakenvidia``) is named by a hash of its sources, the compiler's
version and the flags, so an edit rebuilds it and nothing else does. A build happens in a
temporary directory that is renamed into place, so concurrent test workers never see half a
library, and the one that loses the race throws its copy away. The whole build takes well under a
second, so there is nothing to gain from the shared ``$GPUSHARE_CACHE``.

The flags are the quality bar as much as the build: C11, every warning an error, and hidden
visibility, so the mock exports exactly the NVML entry points that carry NVML_EXPORT.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fakenvidia.errors import FakeNvidiaError

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "build" / "fakenvidia"
NVML_SONAME = "libnvidia-ml.so.1"

CFLAGS = ("-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden", "-pthread")
# -z defs: an unresolved symbol fails the link here, not the dlopen in a caller.
SHARED = ("-shared", "-Wl,-z,defs")
_TIMEOUT_S = 120


def mock_nvml_sources() -> list[Path]:
    """The mock's C files and headers (headers are hashed, not compiled)."""
    return sorted((HERE / "mock_nvml").glob("*.[ch]"))


def build_mock_nvml(out: Path | None = None) -> Path:
    """``libnvidia-ml.so.1``, the mock NVML, built (or found built) under ``out``."""
    return _build("mock-nvml", mock_nvml_sources(), [*CFLAGS, *SHARED, f"-Wl,-soname,{NVML_SONAME}"], NVML_SONAME, out)


def build_stub_library(soname: str, out: Path | None = None) -> Path:
    """A stub driver library whose ELF soname is ``soname`` (``libcuda.so.1``), file named after it."""
    if "/" in soname or not soname.startswith("lib") or ".so" not in soname:
        raise FakeNvidiaError(f"fakenvidia: {soname!r} is no library soname (lib<name>.so.<version>)")
    sources = [HERE / "stubs" / "driver_library.c"]
    return _build(soname, sources, [*CFLAGS, *SHARED, f"-Wl,-soname,{soname}"], soname, out)


def build_stub_tool(out: Path | None = None) -> Path:
    """The stub driver tool (``nvidia-smi`` and the rest are copies of it)."""
    return _build("driver-tool", [HERE / "stubs" / "driver_tool.c"], list(CFLAGS), "nvidia-tool", out)


@functools.cache
def compiler() -> tuple[str, str]:
    """The path of ``cc`` and its version line, which is part of every build's hash."""
    cc = shutil.which("cc")
    if cc is None:
        raise FakeNvidiaError("fakenvidia: no C compiler: `cc` is not on PATH (apt-get install gcc)")
    version = _run([cc, "--version"]).splitlines()
    return cc, version[0] if version else ""


@functools.cache
def multiarch() -> str:
    """The Debian multiarch triplet (``x86_64-linux-gnu``): where a driver's libraries live under /usr/lib."""
    triplet = _run([compiler()[0], "-print-multiarch"]).strip()
    if not triplet:
        raise FakeNvidiaError("fakenvidia: `cc -print-multiarch` printed nothing; a Debian-style gcc is needed")
    return triplet


def _build(kind: str, sources: Sequence[Path], args: Sequence[str], filename: str, out: Path | None) -> Path:
    root = out if out is not None else DEFAULT_OUT
    cc, version = compiler()
    digest = hashlib.sha256()
    for part in (kind, version, *args):
        digest.update(part.encode() + b"\0")
    for source in sources:
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    dest = root / f"{kind}-{digest.hexdigest()[:16]}"
    target = dest / filename
    if target.is_file():
        return target

    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{kind}-", dir=root))
    try:
        c_files = [str(s) for s in sources if s.suffix == ".c"]
        _run([cc, *args, "-o", str(scratch / filename), *c_files])
        try:
            scratch.rename(dest)
        except OSError:
            if not target.is_file():  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise FakeNvidiaError(f"fakenvidia: {argv[0]} did not run: {e}") from e
    if done.returncode != 0:
        raise FakeNvidiaError(f"fakenvidia: `{' '.join(argv)}` failed ({done.returncode}):\n{done.stderr.strip()}")
    return done.stdout
