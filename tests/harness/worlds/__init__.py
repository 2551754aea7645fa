"""gpushare-specific worlds built on the generic local cluster (localcluster/): the agent as the
DaemonSet's pod, the spot environment, simulated nodes running the agent's own node pass, and the
scale world around them.

They live with the tests, not in localcluster/, because they reach into the product's internals
(the agent's node pass and API client, the pod facts, the cgroup index): kept here, localcluster
needs nothing from the agent or the command line, and an import contract (.importlinter) holds it
to that. The demo and the benchmarks import them from here too, with the repository root on
``sys.path``.
"""
