"""`make cluster-up` / `make cluster-down`: a detached one-node cluster in a directory of your choice.

.venv/bin/python -m localcluster up   [--root /tmp/gs-kube]   # prints export KUBECONFIG=...
.venv/bin/python -m localcluster down [--root /tmp/gs-kube]   # everything it started is gone
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from localcluster.bringup import new_cluster, reap_dead_clusters
from localcluster.cluster import Cluster
from localcluster.errors import ClusterError
from localcluster.layout import Layout

DEFAULT_CLI_ROOT = Path("/tmp/gs-kube")


def _cli_up(root: Path) -> int:
    reap_dead_clusters()
    if (root / "cluster.json").exists():
        print(f"a cluster is already up in {root} (make cluster-down first)", file=sys.stderr)
        return 1
    c = new_cluster(root)
    c.owner = None  # detached: it lives on after this command, until `down`
    try:
        c.start()
    except BaseException:
        c.stop()
        c.layout.state_file.unlink(missing_ok=True)  # logs stay for reading; a new `up` may run
        raise
    t = c.timings
    print(f"# cluster up in {t['ready']:.1f} s (node Ready at {t['node_ready']:.1f} s); logs in {c.layout.logs}")
    print(f"# device plugins: {c.device_plugin_dir}  pod-resources: {c.pod_resources_socket}")
    print(f"# CRI: {c.cri_socket}  NRI: {c.nri_socket}")
    print(f"export KUBECONFIG={c.kubeconfig}")
    return 0


def _cli_down(root: Path) -> int:
    state_file = Layout(root).state_file
    if not state_file.exists():
        print(f"no cluster state in {state_file}; nothing to stop", file=sys.stderr)
        return 0
    c = Cluster.from_state(json.loads(state_file.read_text()))
    problems = c.stop()
    if problems:
        print("teardown left:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    shutil.rmtree(root, ignore_errors=True)
    print(f"# cluster in {root} stopped; nothing left behind")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m localcluster", description=__doc__.split("\n")[0])
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--root", type=Path, default=DEFAULT_CLI_ROOT, help=f"cluster dir (default {DEFAULT_CLI_ROOT})")
    args = parser.parse_args(argv)
    try:
        return _cli_up(args.root) if args.action == "up" else _cli_down(args.root)
    except ClusterError as e:
        print(str(e), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
