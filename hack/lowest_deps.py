#!/usr/bin/env python3
"""The lowest-versions lane: are the floors in pyproject.toml true?

A fresh virtualenv gets exactly the lowest version every direct dependency allows (`[project]
dependencies` and the `test` extra), pinned `name==floor` through a constraints file because pip
has no "lowest" resolution; what those need in turn is resolved by pip as usual, newest first.
The project's wheel is built with the floors of `[build-system] requires` and installed without
its dependencies, `pip check` must find nothing broken, and the unit and property tiers run there.

    python hack/lowest_deps.py      # `make test-lowest`; the lowest_deps tier of `make test` runs it too

The virtualenv lives under `$GPUSHARE_CACHE/lowest-deps` and is made anew on every run; pip's own
cache is reused, so only a new floor downloads anything. Without the package index the run fails:
a floor that cannot be installed is a false floor.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

REPO = Path(__file__).resolve().parent.parent
EXTRA = "test"
TIERS = ("tests/unit", "tests/property")
# pytest and pytest-xdist set these in every process they start; the inner run must not take
# itself for a worker of the outer one.
_INHERITED_PYTEST = re.compile(r"^(PYTEST_|PYTEST$|COV_CORE_)")
_SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)\b")


class FloorError(ValueError):
    """A requirement whose lowest allowed version cannot be told from its specifier."""


class LaneError(RuntimeError):
    """A step of the lane failed; the message names the step and carries its output's tail."""


@dataclass(frozen=True)
class Pin:
    """A direct dependency at its floor: `requirement` as pyproject writes it, `version` its lowest."""

    name: str  # canonical (PEP 503)
    version: str
    requirement: str

    @property
    def line(self) -> str:
        return f"{self.name}=={self.version}"


def floor_of(requirement: str) -> Pin:
    """The lowest version `requirement` allows: its `>=`, `~=` or `==` bound.

    The bound must be a version the other clauses admit, and there must be one: without a lower
    bound the lowest allowed version is the oldest ever released, which nobody means.
    """
    try:
        req = Requirement(requirement)
    except InvalidRequirement as exc:
        raise FloorError(f"{requirement!r} is not a requirement: {exc}") from exc
    name = canonicalize_name(req.name)
    if req.url:
        raise FloorError(f"{requirement!r} names a URL, not a version range: it has no floor")
    bounds = []
    for spec in req.specifier:
        if spec.operator in (">=", "~=", "==", "==="):
            if spec.version.endswith(".*"):
                raise FloorError(f"{requirement!r}: a wildcard {spec} is no single floor; write >=")
            bounds.append(spec.version)
        elif spec.operator == ">":
            raise FloorError(
                f"{requirement!r}: '>{spec.version}' excludes its own bound; write the lowest allowed as >="
            )
    if not bounds:
        raise FloorError(f"{requirement!r} has no floor: give it a lower bound (>=) it is known to work with")
    try:
        floor = max(bounds, key=Version)
    except InvalidVersion as exc:
        raise FloorError(f"{requirement!r}: {exc}") from exc
    if not req.specifier.contains(floor, prereleases=True):
        raise FloorError(f"{requirement!r}: its floor {floor} is excluded by its own other clauses")
    return Pin(name, floor, requirement)


def lowest_pins(requirements: Iterable[str], environment: Mapping[str, str] | None = None) -> list[Pin]:
    """A pin for every requirement whose marker holds here; FloorError naming each one without a floor."""
    pins: dict[str, Pin] = {}
    problems = []
    for raw in requirements:
        req = Requirement(raw)
        if req.marker is not None and not req.marker.evaluate(dict(environment) if environment else None):
            continue
        try:
            pin = floor_of(raw)
        except FloorError as exc:
            problems.append(str(exc))
            continue
        other = pins.get(pin.name)
        if other is not None and other.version != pin.version:
            problems.append(f"{pin.name} is required twice with different floors: {other.requirement!r}, {raw!r}")
        pins[pin.name] = pin
    if problems:
        raise FloorError("; ".join(problems))
    return sorted(pins.values(), key=lambda p: p.name)


def build_pins(requirements: Iterable[str]) -> list[Pin]:
    """The floors of `[build-system] requires` that have one; a build tool without a floor is left
    to pip (setuptools' `wheel` helper, for one), since no clause of ours says which is oldest."""
    out = []
    for raw in requirements:
        try:
            out.append(floor_of(raw))
        except FloorError:
            if Requirement(raw).specifier:
                raise
    return sorted(out, key=lambda p: p.name)


def project_requirements(pyproject: Mapping[str, object]) -> tuple[list[str], list[str]]:
    """(`[project] dependencies` + the `test` extra, `[build-system] requires`) of a parsed pyproject."""
    project = pyproject["project"]
    build = pyproject["build-system"]
    assert isinstance(project, dict) and isinstance(build, dict)
    extras = project.get("optional-dependencies", {})
    if EXTRA not in extras:
        raise FloorError(f"pyproject.toml has no [project.optional-dependencies] {EXTRA!r}")
    return [*project["dependencies"], *extras[EXTRA]], list(build["requires"])


def constraints_text(pins: Iterable[Pin]) -> str:
    return "".join(f"{p.line}\n" for p in pins)


def pin_mismatches(pins: Iterable[Pin], installed: Mapping[str, str]) -> list[str]:
    """Each pin the environment does not hold at exactly its floor (`installed`: name -> version)."""
    have: dict[str, str] = {str(canonicalize_name(k)): v for k, v in installed.items()}
    out = []
    for pin in pins:
        got = have.get(pin.name)
        if got is None:
            out.append(f"{pin.name}: not installed (floor {pin.version})")
        elif Version(got) != Version(pin.version):
            out.append(f"{pin.name}: {got} installed, floor {pin.version}")
    return out


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's closing summary line ("2049 passed, 3 skipped in 107.09s")."""
    lines = [line for line in output.splitlines() if re.search(r"\b(passed|failed|errors?)\b.* in [0-9.]+s", line)]
    if not lines:
        return {}
    counts: dict[str, int] = {}
    for number, word in _SUMMARY.findall(lines[-1]):
        key = "error" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(number)
    return counts


def clean_env(env: Mapping[str, str], build_constraints: Path | None = None) -> dict[str, str]:
    """The environment for the lane's commands: no outer pytest's or virtualenv's traces, pip quiet
    about its own version, and (for the wheel build) the build floors as pip's constraints, which
    pip also applies inside its isolated build environment."""
    out = {k: v for k, v in env.items() if not _INHERITED_PYTEST.match(k)}
    for key in ("VIRTUAL_ENV", "PYTHONHOME", "PIP_CONSTRAINT", "PIP_REQUIRE_VIRTUALENV", "PYTHONPATH"):
        out.pop(key, None)
    out["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    out["PIP_NO_INPUT"] = "1"
    if build_constraints is not None:
        out["PIP_CONSTRAINT"] = str(build_constraints)
    return out


@dataclass
class LaneResult:
    pins: list[Pin]
    build: list[Pin]
    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    output: str = ""  # the tiers' pytest output

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def _cache_root() -> Path:
    explicit = os.environ.get("GPUSHARE_CACHE")
    if explicit:
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpushare"


def _run(step: str, cmd: list[str], env: Mapping[str, str], cwd: Path, timeout_s: float) -> str:
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=dict(env), capture_output=True, text=True, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        raise LaneError(f"{step}: still running after {timeout_s:.0f} s: {' '.join(cmd)}") from exc
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise LaneError(f"{step} failed (exit {proc.returncode}): {' '.join(cmd)}\n{output[-6000:]}")
    return output


def _source_copy(dest: Path) -> Path:
    """The working tree's files (tracked, and untracked but not ignored) copied to `dest`: the
    wheel is built from sources only, never from what a developer built in place."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def run_lane(workers: int = 2, log: bool = False) -> LaneResult:
    """Run the lane; LaneError (or FloorError) names the step that failed."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    runtime, build_reqs = project_requirements(pyproject)
    result = LaneResult(lowest_pins(runtime), build_pins(build_reqs))
    root = _cache_root() / "lowest-deps"
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one lane at a time per cache: it remakes the venv
        venv, work = root / "venv", root / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        (work / "constraints.txt").write_text(constraints_text(result.pins))
        (work / "build-constraints.txt").write_text(constraints_text(result.build))
        env = clean_env(os.environ)
        py = str(venv / "bin" / "python")
        pip = [py, "-m", "pip"]

        def step(
            name: str, cmd: list[str], timeout_s: float, cwd: Path = work, step_env: Mapping[str, str] = env
        ) -> str:
            started = time.monotonic()
            if log:
                print(f"lowest-deps: {name} ...", flush=True)
            out = _run(name, cmd, step_env, cwd, timeout_s)
            result.seconds[name] = time.monotonic() - started
            if log:
                print(f"lowest-deps: {name}: {result.seconds[name]:.1f} s", flush=True)
            return out

        # --upgrade-deps: a current pip resolves the floors in half the time of the one Python bundles.
        step("venv", [sys.executable, "-m", "venv", "--clear", "--upgrade-deps", str(venv)], 300)
        requirements = [p.requirement for p in result.pins]
        step("install floors", [*pip, "install", "--constraint", "constraints.txt", *requirements], 600)
        src = _source_copy(work / "src")
        build_env = clean_env(os.environ, work / "build-constraints.txt")
        step(
            "build wheel",
            [*pip, "wheel", "--no-deps", "--wheel-dir", str(work / "dist"), str(src)],
            600,
            work,
            build_env,
        )
        (wheel,) = (work / "dist").glob("gpushare-*.whl")
        step("install gpushare", [*pip, "install", "--no-deps", str(wheel)], 300)
        step("pip check", [*pip, "check"], 120)
        listed = json.loads(step("pip list", [*pip, "list", "--format=json"], 120))
        wrong = pin_mismatches(result.pins, {d["name"]: d["version"] for d in listed})
        if wrong:
            raise LaneError("the environment is not at the floors: " + "; ".join(wrong))
        cmd = [py, "-m", "pytest", *TIERS, "-q", "-p", "no:cacheprovider", "-n", str(workers)]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=not log, text=True, check=False, timeout=1800)
        result.seconds["unit and property tiers"] = time.monotonic() - started
        result.output = (proc.stdout or "") + (proc.stderr or "")
        result.counts = pytest_counts(result.output)
        if proc.returncode != 0:
            raise LaneError(
                f"the unit and property tiers fail at the floors (exit {proc.returncode}):\n{result.output[-8000:]}"
            )
    return result


def main() -> int:
    try:
        result = run_lane(log=True)
    except (LaneError, FloorError) as exc:
        print(f"lowest-deps: {exc}", file=sys.stderr)
        return 1
    print("lowest-deps: floors: " + ", ".join(p.line for p in result.pins))
    print("lowest-deps: build floors: " + ", ".join(p.line for p in result.build))
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in result.seconds.items())
    print(f"lowest-deps: passed in {result.total:.1f} s ({steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
