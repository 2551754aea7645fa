"""Spot on the host: the kernel-module bridge, the utilization watcher, pod cgroups and the killer."""
