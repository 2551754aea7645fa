"""The SBOM `make image` writes beside the agent's archive lists what the image really holds:
Debian's python3, gpushare and grpcio at the versions the running agent pod has, and the image
carries gpushare's licence. The same document is attached inside the archive the node imported,
as an OCI referrer of its image manifest."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from localcluster.paths import REPO
from tests.harness.worlds.agent_pod import DAEMONSET, NAMESPACE, AgentPod
from tests.integration.e2e.conftest import Env

SPDX = "application/spdx+json"


def _build() -> dict[str, str]:
    """`hack/image/build.py agent` as `make image` runs it (the tier built the image already, so
    this reuses the archive); its report, field by field."""
    argv = [sys.executable, str(REPO / "hack" / "image" / "build.py"), "agent"]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False, cwd=REPO)
    assert res.returncode == 0, f"{res.stdout}{res.stderr}"
    fields = {}
    for line in res.stdout.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _in_pod(e: Env, *argv: str) -> str:
    return e.cluster.kubectl("exec", "-n", NAMESPACE, f"ds/{DAEMONSET}", "--", *argv).stdout


def _blob(tar: tarfile.TarFile, digest: str) -> bytes:
    handle = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
    assert handle is not None, digest
    return handle.read()


def _package(doc: dict[str, Any], purl_type: str, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [
        p
        for p in doc["packages"]
        if p["name"] == name
        and any(r["referenceLocator"].startswith(f"pkg:{purl_type}/") for r in p.get("externalRefs", []))
    ]
    assert len(found) == 1, f"the SBOM lists {len(found)} {purl_type} packages named {name}"
    return found[0]


def test_the_sbom_lists_what_the_running_image_holds(e2e: Env) -> None:
    if not isinstance(e2e.agent, AgentPod):
        pytest.skip("the agent runs as a host process (GPUSHARE_AGENT_MODE=process): no image was installed")
    report = _build()
    archive = Path(report["archive"].split(" (", 1)[0])
    sbom_path = Path(report["sbom"].split(" (", 1)[0])
    raw = sbom_path.read_bytes()
    doc = json.loads(raw)
    assert doc["spdxVersion"] == "SPDX-2.3" and doc["name"] == report["image"]

    python3 = _in_pod(e2e, "dpkg-query", "-W", "-f", "${Version}", "python3").strip()
    script = (
        "import importlib.metadata as m, json;"
        "d = m.distribution('gpushare');"
        "lic = [f for f in d.files if f.name == 'LICENSE'];"
        "print(json.dumps({'versions': {n: m.version(n) for n in ('gpushare', 'grpcio')},"
        " 'license': lic[0].read_text() if lic else ''}))"
    )
    pod = json.loads(_in_pod(e2e, "python3", "-c", script))
    assert python3 and _package(doc, "deb", "python3")["versionInfo"] == python3
    for name in ("gpushare", "grpcio"):
        entry = _package(doc, "pypi", name)
        assert entry["versionInfo"] == pod["versions"][name], (name, entry, pod["versions"])
        assert f"pkg:pypi/{name}@{pod['versions'][name]}" in [r["referenceLocator"] for r in entry["externalRefs"]]
    assert _package(doc, "pypi", "gpushare")["licenseDeclared"] == "Apache-2.0"
    assert "Apache License" in pod["license"] and "Version 2.0, January 2004" in pod["license"]

    with tarfile.open(archive) as tar:
        index_file = tar.extractfile("index.json")
        assert index_file is not None
        manifests = json.loads(index_file.read())["manifests"]
        (image,) = [m for m in manifests if "artifactType" not in m]
        (referrer,) = [m for m in manifests if m.get("artifactType") == SPDX]
        manifest = json.loads(_blob(tar, referrer["digest"]))
        assert manifest["subject"]["digest"] == image["digest"] and manifest["artifactType"] == SPDX
        (layer,) = manifest["layers"]
        assert layer["mediaType"] == SPDX and _blob(tar, layer["digest"]) == raw
    (container,) = [p for p in doc["packages"] if p.get("primaryPackagePurpose") == "CONTAINER"]
    assert image["digest"].replace(":", "%3A") in container["externalRefs"][0]["referenceLocator"]
