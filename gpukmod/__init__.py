"""gpukmod: the GPU-ioctl watching kernel module, its helper and the Python client (design §7)."""

__all__: list[str] = []
