"""Test-only harness pieces: NRI plugin processes, a pod-resources server, fake device nodes, the
session's ``cluster`` fixture, and the gpushare-specific worlds (``worlds/``: the agent's pod, the
spot environment, simulated nodes and the scale world). The cluster, containerd and the agent runner
they drive are in localcluster/."""
