#!/usr/bin/env python3
"""Build ``kubectl gpushare`` for operators' machines, apart from the agent (docs/kubectl-gpushare.md).

    python hack/kubectl_dist.py                  # wheel, zipapps, krew archives and manifest, every platform
    python hack/kubectl_dist.py --wheel-only     # the wheel alone (needs no network)
    python hack/kubectl_dist.py --platform linux/amd64 --python 3.11 --base-url https://example.org/v0.1.0

Into ``build/kubectl-dist/`` (``--out``):

- ``kubectl_gpushare-<version>-py3-none-any.whl``: the ``kubectl-gpushare`` distribution, pure
  Python. It holds exactly the modules the plugin imports (its import closure, traced from the
  source) and requires only the third-party packages those modules import, with the floors the
  project's pyproject.toml sets. No compiler, no cffi, gRPC or pyroute2.
- ``kubectl-gpushare-v<version>-<os>-<arch>.pyz``: one file to put on PATH, a zipapp holding the
  wheel's modules and all their dependencies for that platform, for each CPython in ``--python``
  (cli/kubectl/zipapp.py is its ``__main__``).
- ``kubectl-gpushare-v<version>-<os>-<arch>.tar.gz``: that file as krew installs it, and
  ``gpushare.yaml``, the krew manifest naming each archive by ``--base-url`` and its sha256.

setuptools packages only files under its project, so the closure is copied into a staging
directory with a generated pyproject.toml and built there. Everything is reproducible: the
archives' timestamps are the last commit's (SOURCE_DATE_EPOCH if set).
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DIST_NAME = "kubectl-gpushare"
PLUGIN_NAME = "gpushare"  # krew's name: `kubectl gpushare`
ENTRY_MODULES = ("cli.kubectl.plugin",)
SCRIPTS = ("kubectl-gpushare", "kubectl_complete-gpushare")
# The agent's own dependencies: the plugin must run without them (and, for cffi, without a compiler).
AGENT_ONLY = ("cffi", "grpc", "pyroute2", "google.protobuf", "prometheus_client")
ZIPAPP_MAIN = ROOT / "cli" / "kubectl" / "zipapp.py"
PLATFORMS = ("linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64")
PYTHONS = ("3.11", "3.12", "3.13")
SHEBANG = b"#!/usr/bin/env python3\n"
LICENSE = "LICENSE"


def pip_platforms(platform: str) -> list[str]:
    """pip's --platform tags for a Go os/arch. pip widens manylinux2014 and macOS tags to the older
    ones they accept, but not the perennial manylinux_2_Y tags, which are listed one by one."""
    os_name, _, arch = platform.partition("/")
    if os_name == "linux":
        machine = {"amd64": "x86_64", "arm64": "aarch64"}[arch]
        return [*(f"manylinux_2_{y}_{machine}" for y in range(28, 16, -1)), f"manylinux2014_{machine}"]
    if os_name == "darwin":
        # macOS 12 and newer: some dependencies ship no older Intel wheels for the newest CPythons.
        return {"amd64": ["macosx_12_0_x86_64"], "arm64": ["macosx_12_0_arm64"]}[arch]
    raise ValueError(f"--platform {platform!r}: use one of {', '.join(PLATFORMS)}")


# -- the import closure ----------------------------------------------------------------------------------------


def first_party(root: Path = ROOT) -> tuple[str, ...]:
    """The project's top-level packages (pyproject's packages.find include patterns)."""
    doc = tomllib.loads((root / "pyproject.toml").read_text())
    return tuple(p.rstrip("*") for p in doc["tool"]["setuptools"]["packages"]["find"]["include"])


def module_file(name: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*name.split("."))
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(path: Path, module: str) -> set[str]:
    """Every module name a file imports, at any depth (a function's lazy import counts: it runs too),
    except under ``if TYPE_CHECKING:``, which never runs. ``from a import b`` yields a and a.b."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


@dataclass(frozen=True)
class Closure:
    modules: Mapping[str, Path]  # first-party module -> its file
    third_party: frozenset[str]  # top-level names of the other packages those modules import


def closure(entries: Sequence[str] = ENTRY_MODULES, root: Path = ROOT) -> Closure:
    """The first-party modules the entry modules need, read from the source, with their packages'
    ``__init__`` (importing a.b.c runs a and a.b first)."""
    ours = set(first_party(root))
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    modules: dict[str, Path] = {}
    third: set[str] = set()
    todo = list(entries)
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in modules:
                continue
            path = module_file(prefix, root)
            if path is None:
                if i == len(parts) and i > 1:
                    break  # `from a import NAME` where NAME is no module: the attribute of a
                raise ValueError(f"{name}: no module {prefix} under {root}")
            modules[prefix] = path
            for imported in imports_of(path, prefix):
                top = imported.split(".")[0]
                if top in ours:
                    todo.append(imported)
                elif top and top not in stdlib:
                    third.add(top)
    return Closure(dict(sorted(modules.items())), frozenset(third))


PROBE = """
import importlib, importlib.abc, json, sys
blocked = {blocked!r}

class AgentOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ImportError(f"{{name}} is the agent's dependency; the kubectl plugin must not import it")
        return None

sys.meta_path.insert(0, AgentOnly())
for entry in {entries!r}:
    importlib.import_module(entry)
print(json.dumps({{n: getattr(m, "__file__", None) for n, m in sorted(sys.modules.items())}}))
"""


def imported_modules(
    entries: Sequence[str] = ENTRY_MODULES,
    blocked: Sequence[str] = AGENT_ONLY,
    python: str = sys.executable,
    path: Sequence[Path] = (ROOT,),
) -> dict[str, str | None]:
    """What importing the entry modules loads (module -> its file), in a fresh interpreter that
    refuses the agent's dependencies: an import of one fails the probe, naming it."""
    code = PROBE.format(blocked=tuple(blocked), entries=tuple(entries))
    res = subprocess.run(
        [python, "-I", "-c", f"import sys; sys.path[:0] = {[str(p) for p in path]!r}\n{code}"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tempfile.gettempdir(),
    )
    if res.returncode != 0:
        raise RuntimeError(f"importing {', '.join(entries)} failed:\n{res.stderr.strip()}")
    loaded: dict[str, str | None] = json.loads(res.stdout)
    return loaded


def checked_closure(root: Path = ROOT) -> Closure:
    """The closure, proved against a real import: nothing outside it is loaded, nothing agent-only."""
    c = closure(root=root)
    ours = first_party(root)
    loaded = {m for m in imported_modules() if m.split(".")[0] in ours}
    if missing := loaded - set(c.modules):
        raise RuntimeError(f"modules imported but not found by reading the source: {sorted(missing)}")
    return c


# -- the wheel ---------------------------------------------------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(third_party: Iterable[str], root: Path = ROOT) -> list[str]:
    """A requirement per distribution the closure imports: the project's own line (its floor) when
    pyproject lists it, else the bare name."""
    listed = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    by_name = {_canonical(re.split(r"[<>=!~ ;\[]", r, maxsplit=1)[0]): r for r in listed}
    dists = importlib.metadata.packages_distributions()
    out = set()
    for top in third_party:
        if top not in dists:
            raise ValueError(f"{top!r} is imported by the plugin but installed by no distribution here")
        for dist in dists[top]:
            out.add(by_name.get(_canonical(dist), _canonical(dist)))
    return sorted(out, key=_canonical)


def version(root: Path = ROOT) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def scripts(root: Path = ROOT) -> dict[str, str]:
    found = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    missing = [s for s in SCRIPTS if s not in found]
    if missing:
        raise ValueError(f"pyproject.toml [project.scripts] lacks {', '.join(missing)}")
    return {s: found[s] for s in SCRIPTS}


def _toml_list(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def stage(c: Closure, where: Path, root: Path = ROOT) -> Path:
    """A project directory holding the closure and a pyproject.toml describing the distribution."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for path in c.modules.values():
        target = where / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    packages = sorted(m for m, p in c.modules.items() if p.name == "__init__.py")
    entry_points = "\n".join(f"{json.dumps(k)} = {json.dumps(v)}" for k, v in scripts(root).items())
    (where / "README.md").write_text((root / "docs" / "kubectl-gpushare.md").read_text())
    if (root / LICENSE).is_file():
        shutil.copy2(root / LICENSE, where / LICENSE)
    (where / "pyproject.toml").write_text(
        f"""[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST_NAME}"
version = "{version(root)}"
description = "kubectl gpushare: which pod uses which GPU, and why a GPU pod is Pending, evicted or refused"
readme = "README.md"
requires-python = ">=3.11"
license = "Apache-2.0"
dependencies = {_toml_list(requirements(c.third_party, root))}

[project.scripts]
{entry_points}

[tool.setuptools]
packages = {_toml_list(packages)}
"""
    )
    return where


def source_date_epoch(root: Path = ROOT) -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    res = subprocess.run(
        ["git", "-C", str(root), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=False
    )
    return int(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else 315532800  # 1980-01-01


def build_wheel(out: Path, root: Path = ROOT) -> Path:
    """The pure-Python wheel, built by setuptools from a staged copy of the closure."""
    c = checked_closure(root)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kubectl-dist-") as tmp:
        project = stage(c, Path(tmp) / "project", root)
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(source_date_epoch(root))}
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
        subprocess.run([*cmd, "--wheel-dir", tmp, str(project)], check=True, env=env, cwd=tmp)
        (built,) = Path(tmp).glob("*.whl")
        target = out / built.name
        shutil.copyfile(built, target)
    return target


# -- the zipapp --------------------------------------------------------------------------------------------------


def install_for(wheel: Path, target: Path, platform: str, python: str) -> None:
    """The wheel and its dependencies as pip installs them for that platform and CPython, binary
    wheels only (no compiler, here or on the operator's machine)."""
    abi = "cp" + python.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-compile"]
    cmd += ["--target", str(target), "--only-binary=:all:", "--implementation", "cp"]
    cmd += ["--python-version", python, "--abi", abi]
    for tag in pip_platforms(platform):
        cmd += ["--platform", tag]
    res = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(
            f"kubectl_dist: pip found no binary wheels for CPython {python} on {platform} (leave that --python or"
            f" --platform out):\n{res.stderr.strip()}"
        )


def _files(top: Path) -> dict[str, bytes]:
    out = {}
    for path in sorted(top.rglob("*")):
        rel = path.relative_to(top).as_posix()
        if path.is_file() and not rel.startswith("bin/") and "__pycache__" not in rel:
            out[rel] = path.read_bytes()
    return out


def layers(trees: Mapping[str, Mapping[str, bytes]]) -> dict[str, bytes]:
    """Archive members from one install per ABI: ``site/`` what all share byte for byte,
    ``site-cpXY/`` the rest (cli/kubectl/zipapp.py unpacks the two into one directory)."""
    names = set.intersection(*(set(t) for t in trees.values()))
    common = {n for n in names if len({t[n] for t in trees.values()}) == 1}
    members = {f"site/{n}": next(iter(trees.values()))[n] for n in sorted(common)}
    for abi, tree in sorted(trees.items()):
        members.update({f"site-{abi}/{n}": data for n, data in sorted(tree.items()) if n not in common})
    return members


def _zip_date(epoch: int) -> tuple[int, int, int, int, int, int]:
    t = time.gmtime(max(epoch, 315532800))
    return (t.tm_year, t.tm_mon, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec)


def write_zipapp(members: Mapping[str, bytes], bundle: Mapping[str, Any], target: Path, epoch: int) -> Path:
    files = {"__main__.py": ZIPAPP_MAIN.read_bytes(), "bundle.json": json.dumps(bundle, indent=1).encode(), **members}
    with target.open("wb") as f:
        f.write(SHEBANG)
        with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            for name in sorted(files):
                info = zipfile.ZipInfo(name, date_time=_zip_date(epoch))
                info.external_attr = 0o644 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                zf.writestr(info, files[name])
    target.chmod(0o755)
    return target


def build_zipapp(wheel: Path, out: Path, platform: str, pythons: Sequence[str], root: Path = ROOT) -> Path:
    ver = version(root)
    trees = {}
    with tempfile.TemporaryDirectory(prefix="kubectl-zipapp-") as tmp:
        for python in pythons:
            target = Path(tmp) / python
            install_for(wheel, target, platform, python)
            trees["cp" + python.replace(".", "")] = _files(target)
    members = layers(trees)
    digest = hashlib.sha256()
    for name in sorted(members):
        digest.update(name.encode() + b"\0" + hashlib.sha256(members[name]).digest())
    bundle = {"id": digest.hexdigest()[:16], "version": ver, "platform": platform, "abis": sorted(trees)}
    os_name, _, arch = platform.partition("/")
    return write_zipapp(members, bundle, out / f"{DIST_NAME}-v{ver}-{os_name}-{arch}.pyz", source_date_epoch(root))


def krew_archive(pyz: Path, epoch: int, license_file: Path | None = None) -> Path:
    """The zipapp as krew downloads it: a .tar.gz holding the executable ``kubectl-gpushare``, and
    the project's LICENSE beside it when there is one (krew's index asks plugins to ship theirs)."""
    target = pyz.with_suffix(".tar.gz")
    members = [(DIST_NAME, pyz.read_bytes(), 0o755)]
    if license_file is not None and license_file.is_file():
        members.append((LICENSE, license_file.read_bytes(), 0o644))
    raw = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz, tarfile.open(fileobj=gz, mode="w") as tar:
        for name, data, mode in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, epoch
            tar.addfile(info, io.BytesIO(data))
    target.write_bytes(raw.getvalue())
    return target


def archive_files(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return tar.getnames()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _either(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def manifest(
    archives: Mapping[str, Path], ver: str, base_url: str, pythons: Sequence[str], homepage: str = ""
) -> dict[str, Any]:
    """krew's Plugin manifest (krew.googlecontainertools.github.com/v1alpha2) for the archives, by platform."""
    platforms = []
    for platform, archive in sorted(archives.items()):
        os_name, _, arch = platform.partition("/")
        platforms.append(
            {
                "selector": {"matchLabels": {"os": os_name, "arch": arch}},
                "uri": f"{base_url.rstrip('/')}/{archive.name}",
                "sha256": sha256(archive),
                "bin": DIST_NAME,
                "files": [{"from": name, "to": "."} for name in archive_files(archive)],
            }
        )
    spec: dict[str, Any] = {"version": f"v{ver}"}
    if homepage:
        spec["homepage"] = homepage
    spec |= {
        "shortDescription": "Which pod uses which GPU, and why a GPU pod is not running",
        "description": (
            "The operator's view of gpushare (GPU sharing, Docker-in-Docker GPUs and spot lending for\n"
            "Kubernetes): each node's agent, which pods use which GPU and as what, and why a pod is\n"
            "Pending, was evicted or was refused, in one paragraph with the fix.\n"
        ),
        "caveats": (
            f"Needs python3 on PATH: CPython {_either(pythons)}. The first run unpacks the plugin into\n"
            "~/.cache/kubectl-gpushare. For `kubectl gpushare <TAB>`, give it the name kubectl's\n"
            "completion looks for:\n"
            '  ln -s kubectl-gpushare "${KREW_ROOT:-$HOME/.krew}/bin/kubectl_complete-gpushare"\n'
        ),
        "platforms": platforms,
    }
    return {
        "apiVersion": "krew.googlecontainertools.github.com/v1alpha2",
        "kind": "Plugin",
        "metadata": {"name": PLUGIN_NAME},
        "spec": spec,
    }


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, as krew's own manifests write description and caveats."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_ManifestDumper.add_representer(str, _str)


def manifest_text(doc: Mapping[str, Any]) -> str:
    return yaml.dump(dict(doc), Dumper=_ManifestDumper, sort_keys=False, width=120)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "kubectl-dist")
    ap.add_argument("--platform", action="append", choices=PLATFORMS, help="os/arch; repeat (default: all)")
    ap.add_argument("--python", action="append", help=f"CPython X.Y to carry; repeat (default: {' '.join(PYTHONS)})")
    ap.add_argument("--base-url", help="where the archives will be downloaded from (default: file:// of --out)")
    ap.add_argument("--homepage", default="", help="the manifest's homepage")
    ap.add_argument("--wheel-only", action="store_true", help="build the wheel alone (no network needed)")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(out)
    print(f"{wheel.relative_to(out)}  {wheel.stat().st_size} bytes")
    if args.wheel_only:
        return 0
    pythons = args.python or list(PYTHONS)
    epoch = source_date_epoch()
    archives = {}
    for platform in args.platform or PLATFORMS:
        pyz = build_zipapp(wheel, out, platform, pythons)
        archives[platform] = krew_archive(pyz, epoch, ROOT / LICENSE)
        print(f"{pyz.name}  {pyz.stat().st_size} bytes; {archives[platform].name}  {sha256(archives[platform])}")
    doc = manifest(archives, version(), args.base_url or out.as_uri(), pythons, args.homepage)
    (out / f"{PLUGIN_NAME}.yaml").write_text(manifest_text(doc))
    print(f"{PLUGIN_NAME}.yaml  (krew manifest)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
