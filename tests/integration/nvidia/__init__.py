"""The nvidia tier: NVIDIA's real device plugin and Container Toolkit on fakenvidia's mock NVML and driver root."""
