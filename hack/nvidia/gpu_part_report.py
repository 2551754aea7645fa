#!/usr/bin/env python3
"""Do gpushare's DinD target, sharer and spot borrower get the same GPU part of the OCI spec as an exclusive pod?

    flock /tmp/gpushare-cluster.lock .venv/bin/python hack/nvidia/gpu_part_report.py
        [--containerd 1.7.24 --containerd 2.x] [--strategy cdi-cri ...] [--runtime native-cdi ...]
        [--parts] [--json FILE]

For each NVIDIA device-plugin strategy (envvar, volume-mounts, cdi-annotations, cdi-cri) and each
way the node runs containers (plain runc with containerd's own CDI, nvidia-container-runtime in cdi
or jit-cdi mode), on each containerd: one pod whose ``main`` holds GPU 3 exactly as kubelet would
create it from the device plugin's Allocate answer, and whose ``dind`` asks gpushare's NRI plugin
for main's GPU; a sharer pod on it as its shadow; a spot borrower of its GPU. It prints whether each
one's GPU part (devices, device-cgroup rules, driver mounts, NVIDIA_/CUDA_ env, hooks, read from
runc's own config.json) equals main's, and the diff: ``-`` what the recipient lacks, ``+`` what it
has beyond, ``~`` what it has otherwise. ``--parts`` also prints
each exclusive and target part, the exclusive container as NRI showed it to gpushare (before any
runtime's rewrite: what a plugin can copy from it) and the Allocate answers; ``--json`` writes
everything for a later look.

Everything is the real software (NVIDIA's binaries as ``make deps`` builds them, containerd 1.7.24
and 2.4.2, runc) on fakenvidia's driver root; see tests/integration/nvidia/gpu_parts.py for the set-up
and tests/integration/nvidia/test_gpu_parts.py for what is asserted. Needs root; it starts private
containerds, so run it under the cluster lock as shown. It lives in hack/nvidia/ with the other
NVIDIA tooling rather than in bench/: it measures correctness, not time.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from localcluster.containerd import VERSIONS, InstallMissing, find_install
from localcluster.cri import CriClient
from localcluster.paths import NVIDIA_CTK_VERSION, NVIDIA_DEVICE_PLUGIN_VERSION, NvidiaBinaries
from tests.harness.gpu_part import diff
from tests.integration.nvidia.gpu_parts import (
    NOT_RUN,
    RUNTIMES,
    STRATEGIES,
    Measurement,
    NvidiaNode,
    measure_all,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--containerd", action="append", choices=VERSIONS, help="default: every version")
    parser.add_argument("--strategy", action="append", choices=STRATEGIES, help="default: every strategy")
    parser.add_argument("--runtime", action="append", choices=[r.name for r in RUNTIMES], help="default: every one")
    parser.add_argument("--parts", action="store_true", help="print each exclusive part and Allocate answer too")
    parser.add_argument("--json", type=Path, help="write every measurement to this file")
    args = parser.parse_args(argv)

    strategies = args.strategy or list(STRATEGIES)
    runtimes = [r for r in RUNTIMES if not args.runtime or r.name in args.runtime]
    combinations = [(s, r) for s in strategies for r in runtimes]
    results: list[tuple[str, Measurement]] = []
    with NvidiaNode(NvidiaBinaries.find()) as node:
        print(
            f"NVIDIA k8s-device-plugin {NVIDIA_DEVICE_PLUGIN_VERSION} and Container Toolkit {NVIDIA_CTK_VERSION} "
            f"on fakenvidia's driver root; the GPU is GPU {node.gpu_index}, {node.gpu_uuid}"
        )
        if args.parts:
            for strategy in strategies:
                print(f"\nAllocate answer, {strategy}:")
                print("\n".join(f"  {line}" for line in node.allocations[strategy].lines() or ["(empty)"]))
        for version in args.containerd or list(VERSIONS):
            try:
                install = find_install(version)
            except InstallMissing as exc:
                print(f"\n== containerd {version}: not installed ({exc})")
                continue
            with node.containerd(install) as containerd:
                with CriClient(containerd.address) as cri:
                    runtime_version = cri.version().runtime_version
                print(f"\n== containerd {runtime_version}")
                for m in measure_all(node, containerd, combinations):
                    results.append((runtime_version, m))
                    _print(m, parts=args.parts)
    _summary(results)
    print("\nNot measured:")
    for what, why in NOT_RUN.items():
        print(f"  {what}: {why}")
    if args.json is not None:
        args.json.write_text(json.dumps([{"containerd_version": v, **asdict(m)} for v, m in results], indent=1))
    return 0


def _verdict(m: Measurement) -> str:
    """The worst over the DinD target, the sharer and the spot borrower."""
    parts = [part for part, _ in m.recipients().values()]
    if any(part is None for part in parts):
        return "REFUSED"
    gaps = [len(diff(m.exclusive, part)) for part in parts if part is not None]
    return "same" if not any(gaps) else f"differs ({max(gaps)})"


def _print(m: Measurement, *, parts: bool) -> None:
    print(f"\n{m.key}: target {_verdict(m)}")
    if parts:
        print("  exclusive part:")
        print("\n".join(f"    {line}" for line in m.exclusive.lines()))
        if m.target is not None:
            print("  target part:")
            print("\n".join(f"    {line}" for line in m.target.lines()))
        print("  the exclusive container as NRI showed it to gpushare (what a plugin can copy on this containerd):")
        print("\n".join(f"    {line}" for line in m.source_view.lines()))
        print("\n".join(f"    CDI device {name}" for name in m.source_cdi_devices))
    for recipient, (part, refusal) in m.recipients().items():
        if part is None:
            print(f"  {recipient}: refused: {refusal}")
        elif part != m.exclusive:
            print(f"  gap (exclusive -> {recipient}):")
            print("\n".join(f"    {line}" for line in diff(m.exclusive, part)))


def _summary(results: list[tuple[str, Measurement]]) -> None:
    versions = list(dict.fromkeys(v for v, _ in results))
    if not versions:
        return
    by_key = {(v, m.key): m for v, m in results}
    keys = list(dict.fromkeys(m.key for _, m in results))
    width = max(len(k) for k in keys)
    print(f"\n{'strategy x runtime':<{width}}  " + "  ".join(f"{v:<16}" for v in versions))
    for key in keys:
        row = [_verdict(by_key[(v, key)]) if (v, key) in by_key else "-" for v in versions]
        print(f"{key:<{width}}  " + "  ".join(f"{cell:<16}" for cell in row))


if __name__ == "__main__":
    sys.exit(main())
