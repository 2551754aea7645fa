"""Test-only harness pieces: NRI plugin processes, a pod-resources server, fake device nodes and the
session's ``cluster`` fixture. The cluster, containerd and the agent runner they drive are in localcluster/."""
