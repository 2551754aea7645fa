"""The three layers of a gpushare image, each cached by a hash of its inputs (see build.py).

- base: Debian bookworm from mmdebstrap (`--variant=essential`, plus `<image>.packages`),
  without docs, man pages, locales, apt lists, logs, glibc's iconv modules and byte code;
- deps: the project's dependencies from PyPI, pinned to the versions in the virtualenv the
  tests ran against, installed for Debian's python3.11 under /usr/local;
- gpushare: the project's wheel, built from a clean copy of its sources.

For another architecture than the builder's (arch.py: arm64), mmdebstrap installs that
architecture's packages under qemu-user-static, pip takes PyPI's wheels for it, and the wheel's
cffi extension is compiled under emulation in a Debian build root of that architecture.
"""

from __future__ import annotations

import fnmatch
import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

# The repository root, so the one OCI writer and the cache location come from localcluster; and
# this folder, for arch.py when this module is loaded by path (the unit tests) rather than by build.py.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(1, str(Path(__file__).resolve().parent))
from arch import ARCHES, Arch

from localcluster import oci
from localcluster.paths import cache_dir

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
SUITE = "bookworm"
PYTHON_SITE = "usr/local/lib/python3.11/dist-packages"  # on Debian's sys.path, and not dpkg's
MIB = 1 << 20

# What goes into the wheel (pyproject's package list, its build inputs) and what never does.
SOURCE_ROOTS = (
    "pyproject.toml",
    "setup.py",
    "README.md",
    "LICENSE",  # setuptools puts it in the wheel's dist-info, so the image carries it
    "cffi_build",
    "gpushare",
    "nri_plugin",
    "deviceplugins",
    "draplugin",
    "gpukmod",
    "gpumetrics",
    "podcgroups",
    "controller",
    "cli",
)
SOURCE_SKIP_DIRS = {"__pycache__", "build"}
SOURCE_SKIP_SUFFIXES = (".pyc", ".so", ".o", ".ko", ".mod", ".mod.c", ".cmd", ".egg-info")
SOURCE_SKIP_NAMES = {"Module.symvers", "modules.order", "build.log"}

# dpkg never unpacks these (the copyright files stay: they are the licences).
DPKG_EXCLUDES = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/lintian/*",
)
# Dropped from the base: device nodes (the runtime makes /dev), caches and logs of the build,
# byte code (PYTHONDONTWRITEBYTECODE is set), iconv modules (nothing here converts charsets)
# and the Python test suite.
BASE_DROP = (
    "dev/*",
    "var/lib/apt/lists/*",
    "var/cache/apt/*",
    "var/cache/debconf/*-old",
    "var/lib/dpkg/*-old",
    "var/log/*",
    "*/__pycache__",
    "*/__pycache__/*",
    "*.pyc",
    "usr/lib/{multiarch}/gconv/*",
    "usr/lib/python3.11/test/*",
)
# Dropped from the Python layers: console scripts (their shebang is the builder's interpreter),
# byte code, test suites, and the asyncio Kubernetes client (41 MiB) that gpushare never imports.
PY_DROP = (
    "bin",
    "bin/*",
    "*/__pycache__",
    "*/__pycache__/*",
    "*.pyc",
    "*/tests",
    "*/tests/*",
    "kubernetes/aio",
    "kubernetes/aio/*",
)

LAUNCHER = b"""#!/usr/bin/python3
# gpushare's console script, written for Debian's python3 (`python3 -m cli.main` works too).
import sys

from cli.main import main

sys.exit(main())
"""


# Debian packages of the build root a foreign architecture's wheel is compiled in (under emulation).
BUILD_ROOT_PACKAGES = ("python3-dev", "python3-pip", "gcc", "libc6-dev")


class BuildError(RuntimeError):
    """A build step failed; the message names the step and what to do."""


@dataclass(frozen=True)
class Flavour:
    """One image: its repository and its Debian package list."""

    repository: str
    packages: Path
    description: str


FLAVOURS = {
    "agent": Flavour("gpushare/agent", HERE / "agent.packages", "gpushare node agent"),
    "kmod": Flavour("gpushare/agent-kmod", HERE / "kmod.packages", "gpushare: builds and loads gpukmod"),
}


def cache_root() -> Path:
    return cache_dir()


def project_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def _dropper(patterns: Iterable[str]) -> Callable[[str], bool]:
    pats = tuple(patterns)
    return lambda name: not any(fnmatch.fnmatchcase(name, p) for p in pats)


def hash_parts(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part
        h.update(len(raw).to_bytes(8, "big"))
        h.update(raw)
    return h.hexdigest()[:20]


def base_drop(arch: Arch) -> tuple[str, ...]:
    return tuple(p.format(multiarch=arch.multiarch) for p in BASE_DROP)


def _script_hash() -> str:
    """Any change to the builder itself rebuilds every layer."""
    sources = [HERE / "build.py", HERE / "layers.py", HERE / "arch.py", REPO / "localcluster" / "oci.py"]
    return hash_parts(*(path.read_bytes() for path in sources))


def run(cmd: list[str], step: str, log: Path | None = None) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    output = str(proc.stdout) + str(proc.stderr)
    if log is not None:
        log.write_text(output)
    if proc.returncode != 0:
        where = f" (full log: {log})" if log else ""
        raise BuildError(f"{step} failed with exit code {proc.returncode}{where}:\n{output[-3000:]}")


def package_list(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def sources_lines() -> list[str]:
    mirror = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org/debian")
    security = os.environ.get("DEBIAN_SECURITY_MIRROR", "http://deb.debian.org/debian-security")
    return [
        f"deb {mirror} {SUITE} main",
        f"deb {mirror} {SUITE}-updates main",
        f"deb {security} {SUITE}-security main",
    ]


def source_files() -> list[Path]:
    """The wheel's inputs, relative to the repository, sorted (build outputs and byte code left out)."""
    found: list[Path] = []
    for root in SOURCE_ROOTS:
        top = REPO / root
        if top.is_file():
            found.append(Path(root))
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in SOURCE_SKIP_DIRS and not d.endswith(".egg-info")]
            for name in filenames:
                if name not in SOURCE_SKIP_NAMES and not name.endswith(SOURCE_SKIP_SUFFIXES):
                    found.append((Path(dirpath) / name).relative_to(REPO))
    return sorted(found)


def venv_constraints() -> str:
    """`name==version` of every distribution in the running environment but gpushare itself."""
    pins = {
        dist.metadata["Name"].lower().replace("_", "-"): dist.version
        for dist in importlib.metadata.distributions()
        if dist.metadata["Name"] and dist.metadata["Name"].lower() != "gpushare"
    }
    return "".join(f"{name}=={version}\n" for name, version in sorted(pins.items()))


class Builder:
    """Builds (or reuses) the layers of one flavour."""

    def __init__(self, flavour: Flavour, cache: Path, rebuild: bool, arch: Arch = ARCHES["amd64"]) -> None:
        self.flavour = flavour
        self.arch = arch
        self.cache = cache / "image"
        self.layers_dir = self.cache / "layers"
        self.rebuild = rebuild
        self.script = _script_hash()
        self.layers_dir.mkdir(parents=True, exist_ok=True)

    def _layer(self, kind: str, key: str, fill: Callable[[oci.LayerWriter, Path], None]) -> oci.Layer:
        """The cached layer `kind-key`, or a new one made by `fill(writer, scratch dir)`."""
        kind = kind if self.arch.native else f"{kind}-{self.arch.name}"
        blob, meta = self.layers_dir / f"{kind}-{key}.tar.gz", self.layers_dir / f"{kind}-{key}.json"
        cached = None if self.rebuild else oci.Layer.load(blob, meta)
        if cached is not None:
            return cached
        started = time.monotonic()
        print(f"image: building layer {kind} ...", flush=True)
        with tempfile.TemporaryDirectory(dir=self.cache, prefix="build-") as scratch:
            layer = oci.write_layer(blob, lambda w: fill(w, Path(scratch)))
        layer.save_meta(meta)
        # Earlier builds of this layer (never used again); the key's 20 hex digits keep another
        # architecture's `kind-arm64-...` out of the pattern.
        for old in self.layers_dir.glob(f"{kind}-{'[0-9a-f]' * 20}.*"):
            if old not in (blob, meta):
                old.unlink()
        print(f"image: layer {kind}: {layer.uncompressed / MIB:.1f} MiB in {time.monotonic() - started:.0f} s")
        return layer

    def base(self) -> oci.Layer:
        packages = package_list(self.flavour.packages)
        drop = base_drop(self.arch)
        key = hash_parts(self.script, self.arch.name, SUITE, *sources_lines(), *packages, *DPKG_EXCLUDES, *drop)
        kind = f"base-{self.flavour.packages.stem}"
        return self._layer(kind, key, lambda w, tmp: self._fill_base(w, tmp, packages))

    def _fill_base(self, writer: oci.LayerWriter, tmp: Path, packages: list[str]) -> None:
        if shutil.which("mmdebstrap") is None:
            raise BuildError("mmdebstrap is missing: `make image-deps` (apt-get install mmdebstrap) installs it")
        rootfs = tmp / "rootfs.tar"
        cmd = [
            "mmdebstrap",
            "--variant=essential",
            f"--architectures={self.arch.name}",
            f"--include={','.join(packages)}",
            # merged /usr by symlinks, as debootstrap does: the usrmerge package would pull in perl (50 MiB).
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            *(f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES),
            SUITE,
            str(rootfs),
            *sources_lines(),
        ]
        took = "about 1-2 min" if self.arch.native else "about 1-3 min, emulated"
        print(f"image: mmdebstrap of Debian bookworm for {self.arch.name} ({took}) ...", flush=True)
        run(cmd, "mmdebstrap", log=self.cache / f"mmdebstrap-{self.flavour.packages.stem}-{self.arch.name}.log")
        writer.add_rootfs_tar(rootfs, _dropper(base_drop(self.arch)))

    def deps(self) -> oci.Layer:
        project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
        requirements = [str(r) for r in project["dependencies"]]
        constraints = venv_constraints()
        key = hash_parts(self.script, self.arch.name, *requirements, constraints, *PY_DROP)
        return self._layer("deps", key, lambda w, tmp: self._fill_deps(w, tmp, requirements, constraints))

    def _fill_deps(self, writer: oci.LayerWriter, tmp: Path, requirements: list[str], constraints: str) -> None:
        (tmp / "constraints.txt").write_text(constraints)
        target = tmp / "site"
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--only-binary=:all:"]
        cmd = [*pip, *self._wheel_platform(), "--target", str(target), "--constraint", str(tmp / "constraints.txt")]
        run([*cmd, *requirements], f"pip install of the dependencies for {self.arch.name} (PyPI)")
        _strip_debug(target, self.arch)
        writer.add_tree(target, PYTHON_SITE, _dropper(PY_DROP))

    def app(self) -> oci.Layer:
        files = source_files()
        digests = (f"{p}\0{hashlib.sha256((REPO / p).read_bytes()).hexdigest()}" for p in files)
        key = hash_parts(self.script, self.arch.name, *digests, *PY_DROP)
        return self._layer("gpushare", key, lambda w, tmp: self._fill_app(w, tmp, files))

    def _fill_app(self, writer: oci.LayerWriter, tmp: Path, files: list[Path]) -> None:
        # Always the same build directory: the compiled helper records its path, so a random one
        # would change the layer digest on every build.
        src, dist, target = self.cache / "wheel-src", tmp / "dist", tmp / "site"
        shutil.rmtree(src, ignore_errors=True)
        for rel in files:  # a clean copy: nothing a developer built in place reaches the wheel
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
        pip = [sys.executable, "-m", "pip"]
        if self.arch.native:
            wheel_cmd = [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist), str(src)]
            run(wheel_cmd, "pip wheel .")
        else:
            self._emulated_wheel(src, dist)
        (wheel,) = dist.glob("gpushare-*.whl")
        install = [*pip, "install", "--quiet", "--no-deps", "--no-compile", *self._wheel_platform()]
        run([*install, "--target", str(target), str(wheel)], "pip install")
        shutil.rmtree(src)
        _forget_wheel_path(target)
        _strip_debug(target, self.arch)
        writer.add_tree(target, PYTHON_SITE, _dropper(PY_DROP))
        writer.add_bytes("usr/local/bin/gpushare", LAUNCHER, mode=0o755)

    def _wheel_platform(self) -> list[str]:
        """pip's options for another architecture's wheels, for Debian's CPython 3.11 (none for the builder's)."""
        if self.arch.native:
            return []
        tags = [f"--platform={p}" for p in self.arch.wheel_platforms]
        return [*tags, "--python-version=3.11", "--implementation=cp", "--abi=cp311", "--abi=abi3", "--abi=none"]

    def build_root(self) -> Path:
        """A Debian bookworm of the image's architecture with a compiler and Python's headers, made
        once by mmdebstrap (emulated) and kept under the cache, keyed by what it holds."""
        root = self.cache / f"build-root-{self.arch.name}"
        key = hash_parts(SUITE, self.arch.name, *sources_lines(), *BUILD_ROOT_PACKAGES)
        stamp = root.with_name(root.name + ".key")
        if root.is_dir() and stamp.is_file() and stamp.read_text().strip() == key and not self.rebuild:
            return root
        shutil.rmtree(root, ignore_errors=True)
        stamp.unlink(missing_ok=True)
        cmd = [
            "mmdebstrap",
            "--variant=essential",
            f"--architectures={self.arch.name}",
            f"--include={','.join(BUILD_ROOT_PACKAGES)}",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            *(f"--dpkgopt={opt}" for opt in DPKG_EXCLUDES),
            SUITE,
            str(root),
            *sources_lines(),
        ]
        print(f"image: mmdebstrap of the {self.arch.name} build root (about 2-4 min, emulated) ...", flush=True)
        run(cmd, "mmdebstrap of the build root", log=self.cache / f"mmdebstrap-build-root-{self.arch.name}.log")
        stamp.write_text(key + "\n")
        return root

    def _emulated_wheel(self, src: Path, dist: Path) -> None:
        """`pip wheel` of `src` run by the build root's own python3 in a chroot, under qemu: the
        cffi extension is compiled by that architecture's gcc against its Python headers. The
        build requirements come from a wheelhouse the builder's pip fills (at the versions of
        .venv, as the native build uses), so nothing inside reaches the network."""
        root = self.build_root()
        inside = {name: root / f"gpushare-{name}" for name in ("src", "dist", "wheels")}
        for path in inside.values():
            shutil.rmtree(path, ignore_errors=True)
        requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
        constraints = inside["wheels"].with_name("gpushare-constraints.txt")
        constraints.write_text(venv_constraints())
        pip = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", *self._wheel_platform()]
        run(
            [*pip, "-d", str(inside["wheels"]), "-c", str(constraints), *requires],
            "pip download of the build requirements",
        )
        # Always the same path inside, like the native build: the compiled helper records it.
        shutil.copytree(src, inside["src"])
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}
        env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/gpushare-wheels", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        cmd = ["chroot", str(root), "python3", "-m", "pip", "wheel", "--quiet", "--no-deps"]
        cmd += ["-w", "/gpushare-dist", "/gpushare-src"]
        print(f"image: building the gpushare wheel for {self.arch.name} under emulation ...", flush=True)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr)[-3000:]
            raise BuildError(f"pip wheel in the {self.arch.name} build root failed ({proc.returncode}):\n{out}")
        dist.mkdir(parents=True, exist_ok=True)
        for wheel in inside["dist"].glob("gpushare-*.whl"):
            shutil.copy2(wheel, dist / wheel.name)
        for path in inside.values():
            shutil.rmtree(path)
        constraints.unlink()


def _forget_wheel_path(site: Path) -> None:
    """pip records where the wheel file was (a scratch path) in direct_url.json: drop it and its RECORD line."""
    for direct_url in site.glob("*.dist-info/direct_url.json"):
        direct_url.unlink()
        record = direct_url.with_name("RECORD")
        entry = f"{direct_url.parent.name}/direct_url.json,"
        lines = record.read_text().splitlines(keepends=True)
        record.write_text("".join(line for line in lines if not line.startswith(entry)))


def _strip_debug(tree: Path, arch: Arch) -> None:
    """Debug sections of the shared objects: several MiB the agent never reads (skipped without
    binutils for the architecture: the builder's `strip`, or `<multiarch>-strip` for another)."""
    strip = shutil.which("strip" if arch.native else f"{arch.multiarch}-strip")
    objects = sorted(str(p) for p in tree.rglob("*.so*") if p.is_file() and not p.is_symlink())
    if strip and objects:
        run([strip, "--strip-debug", *objects], "strip --strip-debug")
