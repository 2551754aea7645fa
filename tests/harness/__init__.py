"""Reusable harnesses that start real peers for the integration tiers (containerd, kubelet, QEMU)."""
