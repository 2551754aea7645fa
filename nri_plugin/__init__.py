"""containerd NRI plugin: device sync at CreateContainer (design §5, §8)."""

__all__: list[str] = []
