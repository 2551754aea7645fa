"""The ``kubectl-gpushare`` distribution (hack/kubectl_dist.py), offline: the plugin's import
closure is complete and minimal, the wheel holds exactly it and requires only what it imports,
and the zipapp's and krew's pieces are what they claim. The built zipapp, krew archive and a
clean install are checked for real in tests/integration/kubectl_dist."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from types import ModuleType

import pytest

from cli.kubectl import zipapp

REPO = Path(__file__).resolve().parents[4]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("kubectl_dist", REPO / "hack" / "kubectl_dist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


dist = _load()
AGENT_PARTS = ("nri_plugin", "deviceplugins", "draplugin", "gpukmod", "gpumetrics", "podcgroups")


@pytest.fixture(scope="module")
def closure() -> object:
    return dist.closure()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built: Path = dist.build_wheel(tmp_path_factory.mktemp("wheel"))
    return built


def test_the_closure_is_what_importing_the_plugin_loads(closure: object) -> None:
    """Complete: nothing imported is missing from it. Minimal: nothing in it goes unimported. The
    import runs in a fresh interpreter that refuses cffi, gRPC, pyroute2, protobuf and the
    Prometheus client, so none of them is imported by any module the plugin needs."""
    loaded = dist.imported_modules()
    ours = {m for m in loaded if m.split(".")[0] in dist.first_party()}
    assert ours == set(closure.modules)  # type: ignore[attr-defined]
    assert not {m for m in loaded if m.split(".")[0] in ("cffi", "grpc", "pyroute2", "prometheus_client")}
    assert not any(m == "google.protobuf" or m.startswith("google.protobuf.") for m in loaded)


def test_the_closure_leaves_the_agent_behind(closure: object) -> None:
    modules = set(closure.modules)  # type: ignore[attr-defined]
    assert {"cli.kubectl.plugin", "cli.kubectl.complete", "controller.io.kube_client", "gpushare.keys"} <= modules
    assert not [m for m in modules if m.split(".")[0] in AGENT_PARTS]
    assert not {"cli.status", "cli.main", "cli.agent", "controller.report", "controller.loop"} & modules
    assert closure.third_party == {"kubernetes", "typer", "urllib3", "yaml"}  # type: ignore[attr-defined]


def test_the_probe_catches_an_agent_dependency(tmp_path: Path) -> None:
    pkg = tmp_path / "leaky"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("import json\nimport grpc\n")
    with pytest.raises(RuntimeError, match="grpc is the agent's dependency"):
        dist.imported_modules(entries=("leaky",), path=(tmp_path,))


def test_a_lazy_import_is_part_of_the_closure(tmp_path: Path) -> None:
    """A module imported inside a function runs too: reading the source finds it, importing does not."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.packages.find]\ninclude = ["app*"]\n')
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("")
    (tmp_path / "app" / "main.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app import typing_only\n"
        "def run():\n    from app.lazy import go\n    import requests\n    return go()\n"
    )
    (tmp_path / "app" / "lazy.py").write_text("def go(): ...\n")
    (tmp_path / "app" / "typing_only.py").write_text("")
    found = dist.closure(entries=("app.main",), root=tmp_path)
    assert set(found.modules) == {"app", "app.main", "app.lazy"}
    assert found.third_party == {"requests"}


def _projects(*names: str) -> list[str]:
    """The project's own requirement lines for these distributions, as pyproject.toml writes them."""
    listed = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    return [next(r for r in listed if r.lower().startswith(n)) for n in names]


# urllib3 comes with kubernetes, and pyproject sets no floor of its own for it.
REQUIRES = [*_projects("kubernetes", "pyyaml", "typer"), "urllib3"]


def test_requirements_are_the_imported_distributions_with_the_projects_floors() -> None:
    assert dist.requirements({"kubernetes", "typer", "urllib3", "yaml"}) == REQUIRES
    with pytest.raises(ValueError, match="'no_such_module' is imported by the plugin"):
        dist.requirements({"no_such_module"})


def test_the_wheel_holds_exactly_the_closure(tmp_path: Path, closure: object, wheel: Path) -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert wheel.name == f"kubectl_gpushare-{project['version']}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(zf.read(info).decode())
        entry_points = zf.read(info.replace("METADATA", "entry_points.txt")).decode()
    modules = {str(p.relative_to(REPO)) for p in closure.modules.values()}  # type: ignore[attr-defined]
    assert {n for n in names if ".dist-info/" not in n} == modules
    assert not [n for n in names if n.endswith((".so", ".c", ".pyd"))]
    assert (metadata["Name"], metadata["Version"]) == ("kubectl-gpushare", project["version"])
    assert sorted(metadata.get_all("Requires-Dist")) == REQUIRES
    for script in ("kubectl-gpushare", "kubectl_complete-gpushare"):
        assert f"{script} = {project['scripts'][script]}" in entry_points
    again = dist.build_wheel(tmp_path / "again")
    assert again.read_bytes() == wheel.read_bytes(), "the wheel is not reproducible"


def test_the_wheel_runs_from_its_own_files(tmp_path: Path, wheel: Path) -> None:
    """Unpacked alone on the path, the wheel's modules are the ones imported, and none is missing."""
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    loaded = dist.imported_modules(path=(site,))
    ours = {m: f for m, f in loaded.items() if m.split(".")[0] in dist.first_party()}
    assert ours and all(f is not None and f.startswith(str(site)) for f in ours.values()), ours


def test_layers_share_what_every_python_has_byte_for_byte() -> None:
    trees = {
        "cp311": {"pkg/__init__.py": b"same", "pkg/_core.cpython-311.so": b"elf311", "dep/x.py": b"v1"},
        "cp312": {"pkg/__init__.py": b"same", "pkg/_core.cpython-312.so": b"elf312", "dep/x.py": b"v2"},
    }
    assert dist.layers(trees) == {
        "site/pkg/__init__.py": b"same",
        "site-cp311/dep/x.py": b"v1",
        "site-cp311/pkg/_core.cpython-311.so": b"elf311",
        "site-cp312/dep/x.py": b"v2",
        "site-cp312/pkg/_core.cpython-312.so": b"elf312",
    }


def test_a_zipapp_unpacks_its_pythons_layer_once(tmp_path: Path) -> None:
    members = {"site/a.py": b"A", "site-cp311/b.py": b"311", "site-cp312/b.py": b"312", "site-cp312/c/d.py": b"d"}
    bundle = {"id": "0123abcd", "version": "0.1.0", "platform": "linux/amd64", "abis": ["cp311", "cp312"]}
    pyz = dist.write_zipapp(members, bundle, tmp_path / "k.pyz", 0)
    assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n") and pyz.stat().st_mode & 0o111
    with zipfile.ZipFile(pyz) as zf:
        assert json.loads(zf.read("bundle.json")) == bundle
        assert zf.read("__main__.py") == (REPO / "cli" / "kubectl" / "zipapp.py").read_bytes()
    site = zipapp.unpack(pyz, bundle, "cp312", tmp_path / "cache")
    assert site == tmp_path / "cache" / "0123abcd-cp312"
    assert {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()} == {
        "a.py": b"A",
        "b.py": b"312",
        "c/d.py": b"d",
    }
    (site / "a.py").write_bytes(b"kept")  # a later run finds it and unpacks nothing
    assert zipapp.unpack(pyz, bundle, "cp312", tmp_path / "cache") == site and (site / "a.py").read_bytes() == b"kept"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["0123abcd-cp312"]
    assert dist.write_zipapp(members, bundle, tmp_path / "again.pyz", 0).read_bytes() == pyz.read_bytes()


def test_an_archive_member_outside_its_directory_is_refused() -> None:
    with pytest.raises(ValueError, match="points outside"):
        zipapp.payload(["site/../../etc/x"], "cp311")


@pytest.mark.parametrize(
    ("bundle", "tag", "here", "why"),
    [
        ({"platform": "linux/amd64", "abis": ["cp311", "cp312"]}, "cp312", "linux/amd64", ""),
        ({"platform": "linux/amd64", "abis": ["cp311"]}, "cp313", "linux/amd64", "compiled modules for cp311"),
        ({"platform": "linux/amd64", "abis": ["cp311"]}, "cp311", "darwin/arm64", "built for linux/amd64"),
    ],
)
def test_a_zipapp_on_the_wrong_python_or_machine_says_which(
    bundle: dict[str, object], tag: str, here: str, why: str
) -> None:
    found = zipapp.problem(bundle, tag, here)
    assert (why in found) if why else found == ""


def test_platform_names_are_gos() -> None:
    assert zipapp.this_platform("Linux", "x86_64") == "linux/amd64"
    assert zipapp.this_platform("Darwin", "arm64") == "darwin/arm64"
    assert zipapp.this_platform("Linux", "aarch64") == "linux/arm64"
    assert zipapp.abi_tag((3, 12)) == "cp312"
    assert zipapp.cache_root({"XDG_CACHE_HOME": "/c"}, Path("/h")) == Path("/c/kubectl-gpushare")
    assert zipapp.cache_root({}, Path("/h")) == Path("/h/.cache/kubectl-gpushare")
    assert dist.pip_platforms("linux/arm64")[-1] == "manylinux2014_aarch64"
    with pytest.raises(ValueError, match="use one of linux/amd64"):
        dist.pip_platforms("windows/amd64")


def test_the_krew_archive_and_manifest(tmp_path: Path) -> None:
    pyz = tmp_path / "kubectl-gpushare-v0.1.0-linux-amd64.pyz"
    pyz.write_bytes(b"#!/usr/bin/env python3\nPK...")
    archive = dist.krew_archive(pyz, 1_700_000_000)
    with tarfile.open(archive) as tar:
        (member,) = tar.getmembers()
        assert (member.name, member.mode, member.isfile()) == ("kubectl-gpushare", 0o755, True)
        assert tar.extractfile(member).read() == pyz.read_bytes()  # type: ignore[union-attr]
    assert dist.krew_archive(pyz, 1_700_000_000).read_bytes() == archive.read_bytes()
    licence = tmp_path / "LICENSE"
    licence.write_text("Apache License\n")
    arm = tmp_path / "kubectl-gpushare-v0.1.0-linux-arm64.pyz"
    arm.write_bytes(pyz.read_bytes())
    with_licence = dist.krew_archive(arm, 1_700_000_000, licence)
    with tarfile.open(with_licence) as tar:
        assert [(m.name, m.mode) for m in tar.getmembers()] == [("kubectl-gpushare", 0o755), ("LICENSE", 0o644)]
    two = dist.manifest({"linux/arm64": with_licence}, "0.1.0", "https://example.org/r", ["3.11"])
    assert two["spec"]["platforms"][0]["files"] == [
        {"from": "kubectl-gpushare", "to": "."},
        {"from": "LICENSE", "to": "."},
    ]
    doc = dist.manifest({"linux/amd64": archive}, "0.1.0", "https://example.org/r/", ["3.11", "3.12"])
    assert dist.yaml.safe_load(io.StringIO(dist.manifest_text(doc))) == doc
    (platform,) = doc["spec"]["platforms"]
    assert platform["uri"] == "https://example.org/r/kubectl-gpushare-v0.1.0-linux-amd64.tar.gz"
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["selector"] == {"matchLabels": {"os": "linux", "arch": "amd64"}}
    assert platform["files"] == [{"from": "kubectl-gpushare", "to": "."}] and platform["bin"] == "kubectl-gpushare"
    assert "3.11 or 3.12" in doc["spec"]["caveats"]
