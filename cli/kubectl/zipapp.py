"""The ``__main__`` of the single-file ``kubectl-gpushare`` (a zipapp that hack/kubectl_dist.py builds).

The archive carries the plugin and every module it needs, the Kubernetes client included, for
one OS and CPU. Some of those are compiled (pydantic's core), and Python loads a compiled module
only from a file on disk, so the first run unpacks the archive's payload into the user's cache
(``$XDG_CACHE_HOME/kubectl-gpushare``, else ``~/.cache/kubectl-gpushare``), once per archive and
Python version, and every run imports from there. The payload is ``site/`` (the same for every
Python) plus ``site-cpXY/`` (what differs between CPython 3.X and 3.Y: compiled modules and
anything pip resolved differently), unpacked together into one directory.

The name it is run by picks the command: ``kubectl_complete-gpushare`` (a link to the same file)
is the completion executable kubectl looks for; any other name is the plugin.

Only the standard library is imported here: nothing else is on the path yet.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

BUNDLE = "bundle.json"
COMMON = "site/"
COMPLETER_PREFIX = "kubectl_complete-"


def abi_tag(version: tuple[int, int]) -> str:
    return f"cp{version[0]}{version[1]}"


def this_platform(system: str, machine: str) -> str:
    """Go's os/arch names, as krew's selectors and the archive's ``bundle.json`` use them."""
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine.lower(), machine)
    return f"{system.lower()}/{arch}"


def cache_root(env: Mapping[str, str], home: Path) -> Path:
    return Path(env.get("XDG_CACHE_HOME") or home / ".cache") / "kubectl-gpushare"


def payload(names: Iterable[str], tag: str) -> dict[str, str]:
    """Archive member -> path in the unpacked directory: ``site/`` and this Python's ``site-cpXY/``."""
    out: dict[str, str] = {}
    for name in names:
        for prefix in (COMMON, f"site-{tag}/"):
            if name.startswith(prefix) and not name.endswith("/"):
                rel = PurePosixPath(name[len(prefix) :])
                if rel.is_absolute() or ".." in rel.parts:
                    raise ValueError(f"archive member {name!r} points outside its directory")
                out[name] = str(rel)
    return out


def problem(bundle: Mapping[str, Any], tag: str, here: str) -> str:
    """Why this archive cannot run on this Python and machine ("" when it can)."""
    abis = [str(a) for a in bundle.get("abis") or ()]
    if bundle.get("platform") != here:
        return f"this archive is built for {bundle.get('platform')}, and this machine is {here}: use the one for {here}"
    if tag not in abis:
        return (
            f"this archive carries compiled modules for {', '.join(abis)}, and {sys.executable} is {tag}: run it"
            " with one of those as python3, or install the kubectl-gpushare wheel with pip"
        )
    return ""


def unpack(archive: Path, bundle: Mapping[str, Any], tag: str, root: Path) -> Path:
    """The directory the payload is unpacked in, unpacking it first if no earlier run did."""
    dest = root / f"{bundle['id']}-{tag}"
    if dest.is_dir():
        return dest
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{dest.name}.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(archive) as zf:
        for member, rel in payload(zf.namelist(), tag).items():
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, target.open("wb") as out:
                shutil.copyfileobj(src, out)
    try:
        tmp.rename(dest)
    except OSError:
        if not dest.is_dir():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another run unpacked the same archive first
    return dest


def main() -> None:
    archive = Path(__file__).parent  # "<archive>/__main__.py"
    with zipfile.ZipFile(archive) as zf:
        bundle = json.loads(zf.read(BUNDLE))
    tag = abi_tag((sys.version_info.major, sys.version_info.minor))
    why = problem(bundle, tag, this_platform(platform.system(), platform.machine()))
    if why:
        sys.stderr.write(f"kubectl-gpushare: {why}\n")
        raise SystemExit(1)
    try:
        site = unpack(archive, bundle, tag, cache_root(os.environ, Path.home()))
    except OSError as exc:
        sys.stderr.write(f"kubectl-gpushare: cannot unpack itself into the cache ({exc}); set XDG_CACHE_HOME\n")
        raise SystemExit(1) from exc
    sys.path[:0] = [str(site)]
    from cli.kubectl import plugin  # noqa: PLC0415 - importable only now, from the unpacked payload

    if Path(sys.argv[0]).name.startswith(COMPLETER_PREFIX):
        plugin.complete_main()
    else:
        plugin.main()


if __name__ == "__main__":
    main()
