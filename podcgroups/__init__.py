"""podcgroups: a pod's processes on the host, found through its cgroup and killed all together.

How kubelet names a pod's cgroup on v1 and v2 with either driver (``paths``), reading and
writing cgroupfs files with one rule for a cgroup that is gone (``files``), finding a pod's or
a container's cgroup (``cgroups``), SIGKILL of every task of a set of pods that returns once
none is left (``pod_kill``, helped by ``exit_boost``), and a container's pid namespace
(``pidns``). Host I/O only: it knows nothing of Kubernetes objects or of the agent, which
uses it to take a lent GPU back (``controller.spot.killer``).
"""
