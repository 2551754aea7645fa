"""The floors pyproject declares for grpcio and protobuf are the versions the committed stubs
demand: each ``*_pb2_grpc.py`` refuses a grpcio older than ``GRPC_GENERATED_VERSION`` and each
``*_pb2.py`` a protobuf runtime older than the gencode version (or of another major), so a lower
floor would install a wheel whose ``gpushare`` fails at import."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

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
