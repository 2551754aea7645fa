"""kubelet device plugins: thin annotation emitters, one server per resource (design §2, §4)."""

__all__: list[str] = []
