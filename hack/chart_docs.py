"""Write the chart's values.schema.json and README.md from values.yaml (`make chart-docs`).

values.yaml is the one source: every key's default is its value there and its description the
comment block right above it. The schema takes each key's type from its default, closes every
object the chart reads (a misspelt key is an error at `helm install` and `helm lint --strict`)
and leaves open the maps that pass through to Kubernetes (labels, affinity, resources, ...);
``CONSTRAINTS`` adds what a default cannot say (enums, ranges, patterns).

    python hack/chart_docs.py            # rewrite manifests/chart/values.schema.json and README.md
    python hack/chart_docs.py --check    # exit 1 naming the stale file
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "manifests" / "chart"
SCHEMA = "http://json-schema.org/draft-07/schema#"

# Maps whose keys the chart passes to Kubernetes or to the agent's config as they are.
OPEN = {
    "global",
    "commonLabels",
    "podLabels",
    "podAnnotations",
    "affinity",
    "nodeSelector",
    "updateStrategy",
    "resources",
    "kmod.resources",
    "config.extra",
    "config.metrics",
    "hooks.nodeSelector",
    "prometheus.rules.labels",
    "prometheus.serviceMonitor.labels",
    "prometheus.podMonitor.labels",
    "prometheus.tlsConfig",
    "grafana.dashboard.labels",
    "grafana.dashboard.annotations",
}
_NAME_LIST = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]},
    ]
}
_DURATION = {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$"}
# What a default cannot say. Keys absent from values.yaml are an error here (a stale entry).
CONSTRAINTS: dict[str, dict[str, Any]] = {
    "logFormat": {"enum": ["json", "text"]},
    "image.pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "kmod.image.pullPolicy": {"enum": ["Always", "IfNotPresent", "Never"]},
    "global.imagePullSecrets": {"items": _NAME_LIST},
    "imagePullSecrets": {"items": _NAME_LIST},
    "apiServer.port": {"type": ["string", "integer"]},
    "kubelet.rootDir": {"pattern": "^/"},
    "admission.validationActions": {"minItems": 1, "items": {"enum": ["Deny", "Warn", "Audit"]}},
    "admission.maxPodEnvBytes": {"minimum": 0, "maximum": 16777216},
    "admission.excludedNamespaces": {"items": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"}},
    "config.shareSpecs": {"minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 2}},
    "config.devShareSpecs": {"minItems": 1, "uniqueItems": True, "items": {"type": "integer", "minimum": 2}},
    "config.realResources": {"minItems": 1, "items": {"type": "string", "pattern": "^[^/]+/[^/]+$"}},
    "config.warmShadows": {"minimum": 0},
    "config.maxBlockMs": {"minimum": 0},
    "config.shadowIdleTimeout": _DURATION,
    "config.idleWindow": _DURATION,
    "config.stateDir": {"pattern": "^/"},
    "config.nri.socket": {"pattern": "^/"},
    "config.metrics.access": {"enum": ["rbac", "open"]},
    "config.metrics.maxConnections": {"minimum": 8, "maximum": 1024},
    "dra.cdiRoot": {"pattern": "^/"},
    "uninstall.timeout": {"pattern": "^[0-9]+(s|m|h)$"},
    "tolerations": {"items": {"type": "object"}},
    "hooks.tolerations": {"items": {"type": "object"}},
    "kmod.extraHostPaths": {"items": {"type": "string", "pattern": "^/"}},
    "extraArgs": {"items": {"type": ["string", "number", "boolean"]}},
}


@dataclass
class Key:
    path: str
    default: Any
    doc: str


def _described(text: str) -> Iterator[tuple[str, str]]:
    """(dotted key, its comment block) for every key line of values.yaml, in file order."""
    stack: list[tuple[int, str]] = []
    comment: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            comment = []
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^( *)([A-Za-z_][\w.-]*):(\s|$)", line)
        if match is None:  # a list item or a continuation: not a key of its own
            comment = []
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        yield ".".join(k for _, k in stack), " ".join(comment)
        comment = []


def keys(text: str) -> list[Key]:
    values = yaml.safe_load(text)
    out = []
    for path, doc in _described(text):
        node: Any = values
        for part in path.split("."):
            node = node[part]
        out.append(Key(path, node, doc))
    return out


# bool before int: a bool is an int to isinstance.
_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (Mapping, "object"),
)


def _type_of(value: Any) -> str:
    for kind, name in _JSON_TYPES:
        if isinstance(value, kind):
            return name
    raise ValueError(f"a default of type {type(value).__name__} ({value!r}) has no schema type")


def _schema_of(path: str, value: Any, docs: Mapping[str, str]) -> dict[str, Any]:
    node: dict[str, Any] = {"type": _type_of(value)}
    if docs.get(path):
        node["description"] = docs[path]
    if isinstance(value, Mapping):
        node["properties"] = {k: _schema_of(f"{path}.{k}" if path else k, v, docs) for k, v in value.items()}
        node["additionalProperties"] = path in OPEN
    elif isinstance(value, list) and value and all(not isinstance(v, Mapping | list) for v in value):
        node["items"] = {"type": _type_of(value[0])}
    node.update(CONSTRAINTS.get(path, {}))
    return node


def schema(text: str) -> dict[str, Any]:
    values = yaml.safe_load(text)
    docs = {k.path: k.doc for k in keys(text)}
    stale = sorted(set(CONSTRAINTS) - set(docs))
    if stale:
        raise ValueError(f"CONSTRAINTS names keys values.yaml does not have: {stale}")
    root = _schema_of("", values, docs)
    root.pop("description", None)
    return {"$schema": SCHEMA, "title": "gpushare chart values", **root}


def _default(value: Any) -> str:
    if isinstance(value, Mapping | list) and value:
        return "see values.yaml"
    return f"`{json.dumps(value)}`"


def readme(text: str, chart: Mapping[str, Any]) -> str:
    rows = []
    for k in keys(text):
        if isinstance(k.default, Mapping) and k.default and not k.doc:
            continue  # a section without words of its own: its keys have rows
        doc = k.doc.replace("|", "\\|")
        rows.append(f"| `{k.path}` | {_default(k.default)} | {doc} |")
    return (
        f"""# gpushare chart

<!-- Generated by `make chart-docs` from values.yaml; tests/unit/test_chart_docs.py checks it. -->

{chart["description"]}. Version {chart["version"]}, app version {chart["appVersion"]}, Kubernetes
{chart["kubeVersion"]}.

```sh
kubectl create namespace gpushare-system
kubectl label namespace gpushare-system pod-security.kubernetes.io/enforce=privileged
helm install gpushare manifests/chart -n gpushare-system -f my-values.yaml
helm test gpushare -n gpushare-system --logs
```

Label the GPU nodes `gpushare.k8s.io/enabled=true`; turn NRI on in their containerd
(docs/compatibility.md). Installing, upgrading and uninstalling, with what each privilege is
for: docs/install.md. `values.schema.json` refuses a misspelt or mistyped value.

## Values

| key | default | description |
|---|---|---|
"""
        + "\n".join(rows)
        + "\n"
    )


def render() -> dict[Path, str]:
    text = (CHART / "values.yaml").read_text()
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    return {
        CHART / "values.schema.json": json.dumps(schema(text), indent=2) + "\n",
        CHART / "README.md": readme(text, chart),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a file is stale")
    args = p.parse_args(argv)
    stale = 0
    for path, text in render().items():
        if args.check:
            if not path.is_file() or path.read_text() != text:
                print(f"{path} is stale: run `make chart-docs`", file=sys.stderr)
                stale = 1
        else:
            path.write_text(text)
            print(f"wrote {path}")
    return stale


if __name__ == "__main__":
    sys.exit(main())
