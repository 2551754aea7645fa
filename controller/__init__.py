"""The reconcile controller and the agent that wires every part together (design §1)."""

__all__: list[str] = []
