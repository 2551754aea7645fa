"""The agent's I/O: the Kubernetes API client, the pod cache, the Lease, PodResources and the state file."""
