"""The leader's cluster-wide work on 50 simulated nodes: real API server, scheduler and controller-manager,
kwok for the nodes' kubelets, the node side played with the agent's own node-pass code.

Every sharer must end up on the node of the shadow it is recorded on, no shadow may hold more
sharers than its N, and the leader must create exactly the shadows the demand needs, once each.
"""

from __future__ import annotations

from pathlib import Path

from localcluster.cluster import Cluster
from tests.harness.worlds.scale import SHARE_N, check_sharers, scale_world, sharer

NODES = 50
SHARERS = 4 * NODES  # one shadow for every 4: 50 shadows, one GPU of 8 per node


def test_sharers_on_simulated_nodes_share_their_shadows_and_the_idle_ones_go(
    cluster: Cluster, kwok: Path, tmp_path: Path
) -> None:
    # An idle timeout longer than the scheduler's backoff: no shadow may look idle while its
    # sharers are still being bound (that race is the admission tests' subject, not this one's).
    with scale_world(cluster, tmp_path, NODES, idle_s=15.0) as world:
        world.create([sharer(f"sharer-{i}") for i in range(SHARERS)])
        world.wait_bound(SHARERS, timeout_s=300)
        world.wait("every sharer recorded on its shadow", lambda: world.records_written(SHARERS), 300)

        shadows = world.shadows()
        assert check_sharers(world.pods(), shadows) == []
        assert len(shadows) == SHARERS // SHARE_N
        assert len({s["metadata"]["name"] for s in shadows}) == len(shadows)
        # Once each: the pass after a create counts the shadow the API server answered with
        # (PodCache.assume), so no create is repeated against a watch that has not caught up.
        log = world.agent.log_text()
        assert log.count("decision=create-shadow") == len(shadows), log[-3000:]
        assert "shadow already exists" not in log
        assert world.node_side is not None and world.node_side.refused == set()
        # The node side advertised what the product's rule says: N slots per Running shadow.
        on_node: dict[str, int] = {}
        for s in shadows:
            on_node[s["spec"]["nodeName"]] = on_node.get(s["spec"]["nodeName"], 0) + 1
        for node, count in on_node.items():
            assert len(world.node_side.capacity(node).get(f"gpushare/share-gpu-{SHARE_N}", ())) == count * SHARE_N

        world.delete_all(timeout_s=120)
        world.wait("every idle shadow deleted", lambda: not world.shadows(), 180)
