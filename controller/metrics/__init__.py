"""The agent's own ``/metrics``: who holds or sees which GPU, and the Prometheus exposition of a pass."""
