"""Codecs of the injection annotations (design §4).

Parsers are strict and total: any input yields a typed value or ``InstructionRefused``
whose message quotes the annotation and says which rule broke. Encoders emit canonical
JSON (sorted keys, no spaces) so that an annotation written by a device plugin compares
byte-for-byte in tests and logs.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gpushare import keys
from gpushare.errors import InstructionRefused
from gpushare.ids import parse_virtual_id
from gpushare.rules import is_dns_label, is_gpushare_resource

# An annotation value larger than this is refused before it is parsed: the biggest honest
# one (16 virtual IDs of a long shadow name) is well under 2 KiB.
MAX_ANNOTATION_BYTES = 16 * 1024
MAX_IDS_PER_ANNOTATION = 256

# "*" takes the source's whole bundle; a resource name takes only that resource's part.
SELECTOR_ALL = "*"
# The seed's long same-pod form "_/_/<source>": "_" means this namespace and this pod.
SAME_POD_PLACEHOLDER = "_"

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# Kubernetes extended-resource names: "<domain>/<name>".
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
# Real device IDs from vendor plugins: UUIDs, PCI addresses, indexes, MIG names.
_REAL_ID = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.:/]{0,127}$")


@dataclass(frozen=True)
class ContainerRef:
    """A container named by namespace, pod and container name."""

    namespace: str
    pod: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}/{self.container}"


@dataclass(frozen=True)
class DevicesFrom:
    """``container-devices-from``: take the bundle of ``source``, limited to ``selector``.

    ``virtual_ids`` are the shadow slots the device plugin allocated; the NRI plugin checks
    them against PodResources before it trusts the cross-pod source (design §8).
    """

    source: ContainerRef
    selector: str
    virtual_ids: tuple[str, ...]


@dataclass(frozen=True)
class DevicesIds:
    """``container-devices-ids``: real device IDs per real resource name (spot, design §6)."""

    by_resource: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class SamePodSource:
    """Pod annotation ``container-devices-from.<target>: <source>`` (Docker-in-Docker)."""

    target: str
    source: str


def _load_json(key: str, value: object) -> Any:
    if not isinstance(value, str):
        raise InstructionRefused(f"gpushare: annotation {key} must be a string, got {type(value).__name__}")
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_ANNOTATION_BYTES:
        raise InstructionRefused(
            f"gpushare: annotation {key} is {size} bytes; the limit is {MAX_ANNOTATION_BYTES} bytes"
        )
    try:
        return json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise InstructionRefused(f"gpushare: annotation {key} is not valid JSON ({exc}): {value!r:.120}") from exc


def _string_list(key: str, what: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise InstructionRefused(f"gpushare: annotation {key}: {what} must be a non-empty JSON list of strings")
    if len(value) > MAX_IDS_PER_ANNOTATION:
        raise InstructionRefused(f"gpushare: annotation {key}: {what} lists {len(value)} IDs; at most 256")
    if not all(isinstance(v, str) for v in value):
        raise InstructionRefused(f"gpushare: annotation {key}: {what} must contain only strings, got {value!r:.120}")
    if len(set(value)) != len(value):
        raise InstructionRefused(f"gpushare: annotation {key}: {what} repeats an ID: {value!r:.120}")
    return tuple(value)


def parse_container_ref(text: str, *, what: str) -> ContainerRef:
    parts = text.split("/") if isinstance(text, str) else []
    if len(parts) != 3:
        raise InstructionRefused(f"gpushare: {what} {text!r:.120} is not <namespace>/<pod>/<container> (design §4)")
    ns, pod, container = parts
    if not is_dns_label(ns) or not _DNS_SUBDOMAIN.fullmatch(pod) or not is_dns_label(container):
        raise InstructionRefused(f"gpushare: {what} {text!r:.120} has an invalid namespace, pod or container name")
    return ContainerRef(ns, pod, container)


def parse_devices_from(value: object) -> DevicesFrom:
    """Parse ``{"<ns>/<pod>/<container>": {"*": ["<virtual id>", ...]}}``: exactly one source."""
    key = keys.ANNOTATION_DEVICES_FROM
    doc = _load_json(key, value)
    if not isinstance(doc, dict) or len(doc) != 1:
        raise InstructionRefused(
            f"gpushare: annotation {key} must be a JSON object with exactly one source container, got {value!r:.120}"
        )
    ((source_text, spec),) = doc.items()
    source = parse_container_ref(source_text, what=f"annotation {key} source")
    if not isinstance(spec, dict) or len(spec) != 1:
        raise InstructionRefused(
            f"gpushare: annotation {key}: the value for {source} must be an object with one selector "
            f'("*" or a resource name) mapping to virtual IDs'
        )
    ((selector, ids),) = spec.items()
    if selector != SELECTOR_ALL and not _RESOURCE.fullmatch(selector):
        raise InstructionRefused(
            f'gpushare: annotation {key}: selector {selector!r:.80} is neither "*" nor a resource name'
        )
    virtual_ids = _string_list(key, "the virtual IDs", ids)
    for vid in virtual_ids:
        parsed = parse_virtual_id(vid)
        if (parsed.namespace, parsed.shadow) != (source.namespace, source.pod):
            raise InstructionRefused(
                f"gpushare: annotation {key}: virtual ID {vid!r} does not belong to source pod "
                f"{source.namespace}/{source.pod}"
            )
    return DevicesFrom(source=source, selector=selector, virtual_ids=virtual_ids)


def encode_devices_from(
    namespace: str, shadow: str, virtual_ids: list[str], container: str = keys.SHADOW_CONTAINER
) -> str:
    return json.dumps(
        {f"{namespace}/{shadow}/{container}": {SELECTOR_ALL: sorted(virtual_ids)}},
        sort_keys=True,
        separators=(",", ":"),
    )


def parse_devices_ids(value: object) -> DevicesIds:
    """Parse ``{"<real resource>": ["<real id>", ...]}``."""
    key = keys.ANNOTATION_DEVICES_IDS
    doc = _load_json(key, value)
    if not isinstance(doc, dict) or not doc:
        raise InstructionRefused(
            f"gpushare: annotation {key} must be a non-empty JSON object of resource name to IDs, got {value!r:.120}"
        )
    out: list[tuple[str, tuple[str, ...]]] = []
    for resource, ids in sorted(doc.items()):
        if not _RESOURCE.fullmatch(resource) or is_gpushare_resource(resource):
            raise InstructionRefused(
                f"gpushare: annotation {key}: {resource!r:.80} is not a real (vendor) resource name"
            )
        real_ids = _string_list(key, f"the IDs of {resource}", ids)
        for rid in real_ids:
            if not _REAL_ID.fullmatch(rid):
                raise InstructionRefused(f"gpushare: annotation {key}: {rid!r:.80} is not a device ID")
        out.append((resource, real_ids))
    return DevicesIds(tuple(out))


def encode_devices_ids(by_resource: dict[str, list[str]]) -> str:
    return json.dumps({r: list(ids) for r, ids in by_resource.items()}, sort_keys=True, separators=(",", ":"))


def parse_same_pod_annotations(annotations: dict[str, str]) -> dict[str, SamePodSource]:
    """Find every pod annotation ``container-devices-from.<target>``; key the result by target.

    The source must be a container of the same pod: a bare container name, or the long form
    ``_/_/<name>``. Naming any other namespace or pod is refused (design §8).
    """
    prefix = keys.POD_ANNOTATION_DEVICES_FROM_PREFIX
    found: dict[str, SamePodSource] = {}
    for key, value in annotations.items():
        if not key.startswith(prefix):
            continue
        target = key[len(prefix) :]
        if not is_dns_label(target):
            raise InstructionRefused(f"gpushare: pod annotation {key!r:.120}: {target!r:.80} is not a container name")
        if not isinstance(value, str):
            raise InstructionRefused(f"gpushare: pod annotation {key} must be a string naming a container")
        if len(value) > 512:
            raise InstructionRefused(
                f"gpushare: pod annotation {key} is {len(value)} characters; it must name one container "
                "(at most 512 characters)"
            )
        source = value.strip()
        parts = source.split("/")
        if len(parts) == 3:
            if parts[0] != SAME_POD_PLACEHOLDER or parts[1] != SAME_POD_PLACEHOLDER:
                raise InstructionRefused(
                    f'gpushare: pod annotation for "{target}" names {source!r:.120}, which is not a container of '
                    "this pod; a pod annotation may only name its own containers (design §8)"
                )
            source = parts[2]
        elif len(parts) != 1:
            raise InstructionRefused(
                f'gpushare: pod annotation for "{target}" names {source!r:.120}; expected a container name '
                'of this pod or "_/_/<container>"'
            )
        if not is_dns_label(source):
            raise InstructionRefused(f'gpushare: pod annotation for "{target}": {source!r:.80} is not a container name')
        if source == target:
            raise InstructionRefused(f'gpushare: pod annotation for "{target}" names the container itself')
        found[target] = SamePodSource(target=target, source=source)
    return found
