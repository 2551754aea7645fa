"""The floors pyproject declares for grpcio and protobuf are the versions the committed stubs
demand: each ``*_pb2_grpc.py`` refuses a grpcio older than ``GRPC_GENERATED_VERSION`` and each
``*_pb2.py`` a protobuf runtime older than the gencode version (or of another major), so a lower
floor would install a wheel whose ``gpushare`` fails at import."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tests.harness.scripts import load_script

REPO = Path(__file__).resolve().parents[2]
STUBS = sorted(p for p in REPO.glob("*/_pb/*.py") if not p.name.startswith("__"))


def _floors() -> dict[str, str]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for dep in deps:
        m = re.match(r"^(grpcio|protobuf)>=([0-9.]+)(,<([0-9]+))?$", dep)
        if m:
            out[m[1]] = m[2]
            if m[4]:
                out[f"{m[1]}<"] = m[4]
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split("."))


def test_grpcio_floor_is_what_the_stubs_were_generated_with() -> None:
    generated = {
        re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", p.read_text())[1]
        for p in STUBS
        if p.name.endswith("_grpc.py")
    }  # type: ignore[index]
    assert generated, "no gRPC stubs found: the check would pass on nothing"
    assert _floors()["grpcio"] == max(generated, key=_version), generated


def test_protobuf_floor_and_ceiling_are_what_the_stubs_accept() -> None:
    pattern = re.compile(
        r"ValidateProtobufRuntimeVersion\(\s*_runtime_version\.Domain\.PUBLIC,\s*(\d+),\s*(\d+),\s*(\d+),"
    )
    gencode = {tuple(int(x) for x in m.groups()) for p in STUBS if (m := pattern.search(p.read_text()))}
    assert gencode, "no protobuf stubs found: the check would pass on nothing"
    newest = max(gencode)
    floors = _floors()
    assert _version(floors["protobuf"]) == newest, gencode
    # The runtime check also refuses another major version than the gencode's.
    assert {g[0] for g in gencode} == {newest[0]} and floors["protobuf<"] == str(newest[0] + 1)


# The lowest-versions lane (hack/lowest_deps.py, `make test-lowest`, the lowest_deps tier) installs
# every direct dependency at the floor these functions read; they are checked here on plain data.


def _lane() -> ModuleType:
    return load_script(REPO / "hack" / "lowest_deps.py", "lowest_deps")


lane = _lane()


def test_every_direct_dependency_has_a_floor_the_lane_can_pin() -> None:
    runtime, build = lane.project_requirements(tomllib.loads((REPO / "pyproject.toml").read_text()))
    pins = {p.name: p.version for p in lane.lowest_pins(runtime)}
    assert len(pins) == len(runtime), "a requirement is missing from the lane's pins"
    assert pins["grpcio"] == _floors()["grpcio"] and pins["grpcio-tools"] == "1.85.1"
    assert pins["grafana-foundation-sdk"] == "1769699379!11.6.0"
    assert {p.name for p in lane.build_pins(build)} == {"setuptools", "cffi"}  # `wheel` has no floor to pin


@pytest.mark.parametrize(
    ("requirement", "floor"),
    [
        ("protobuf>=7.35.1,<8", "7.35.1"),
        ("kubernetes>=31", "31"),
        ("Typer[all]>=0.26", "0.26"),
        ("grpcio-tools==1.85.1", "1.85.1"),
        ("x~=2.1", "2.1"),
        ("x>=1.0,>=1.2", "1.2"),
        ("x>=1.2,!=1.3", "1.2"),
    ],
)
def test_the_floor_is_the_lowest_version_the_specifier_allows(requirement: str, floor: str) -> None:
    pin = lane.floor_of(requirement)
    assert pin.version == floor and pin.line == f"{pin.name}=={floor}" and pin.requirement == requirement


@pytest.mark.parametrize(
    ("requirement", "error"),
    [
        ("types-protobuf", "has no floor"),
        ("x<2", "has no floor"),
        ("x>1.0", "excludes its own bound"),
        ("x>=1.0,!=1.0", "excluded by its own other clauses"),
        ("x==1.*", "wildcard"),
        ("x @ https://example.invalid/x.whl", "names a URL"),
        ("not a requirement!", "is not a requirement"),
    ],
)
def test_a_requirement_without_a_clear_floor_is_refused_naming_it(requirement: str, error: str) -> None:
    with pytest.raises(lane.FloorError, match=re.escape(error)) as caught:
        lane.floor_of(requirement)
    assert repr(requirement) in str(caught.value)


def test_pins_skip_other_platforms_and_name_every_bad_requirement_at_once() -> None:
    pins = lane.lowest_pins(["a>=1", "b>=2; sys_platform == 'win32'", "C_d>=3"], {"sys_platform": "linux"})
    assert [p.line for p in pins] == ["a==1", "c-d==3"]
    with pytest.raises(lane.FloorError, match=r"'x' has no floor.*'y>1'.*excludes"):
        lane.lowest_pins(["x", "a>=1", "y>1"])
    with pytest.raises(lane.FloorError, match="required twice with different floors"):
        lane.lowest_pins(["a>=1", "A>=2"])


def test_the_environment_must_hold_each_pin_exactly() -> None:
    pins = [lane.floor_of("typer>=0.26"), lane.floor_of("PyYAML>=6"), lane.floor_of("cffi>=1.17")]
    assert lane.pin_mismatches(pins, {"typer": "0.26.0", "pyyaml": "6.0", "cffi": "1.17.0"}) == []
    assert lane.pin_mismatches(pins, {"Typer": "0.29.2", "PyYAML": "6"}) == [
        "typer: 0.29.2 installed, floor 0.26",
        "cffi: not installed (floor 1.17)",
    ]
    assert lane.constraints_text(pins[:2]) == "typer==0.26\npyyaml==6\n"


def test_the_tiers_counts_come_from_pytests_closing_line() -> None:
    out = "....\n= wall time per tier =\nunit 1.0 s\n2049 passed, 2 skipped, 1 error in 107.09s (0:01:47)\n"
    assert lane.pytest_counts(out) == {"passed": 2049, "skipped": 2, "error": 1}
    assert lane.pytest_counts("ERROR: usage\n") == {}


def test_the_inner_run_forgets_the_outer_pytest_and_virtualenv() -> None:
    outer = {
        "PATH": "/usr/bin",
        "PYTEST_XDIST_WORKER": "gw1",
        "PYTEST_CURRENT_TEST": "x",
        "VIRTUAL_ENV": "/work/.venv",
        "PIP_CONSTRAINT": "/elsewhere",
        "GPUSHARE_ALLOW_SKIP": "kernel",
    }
    env = lane.clean_env(outer)
    assert env["PATH"] == "/usr/bin" and env["GPUSHARE_ALLOW_SKIP"] == "kernel"
    assert not {"PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "VIRTUAL_ENV", "PIP_CONSTRAINT"} & set(env)
    assert lane.clean_env(outer, Path("/w/build.txt"))["PIP_CONSTRAINT"] == "/w/build.txt"
