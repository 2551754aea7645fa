"""gpushare's DRA driver: the kubelet plugin that serves gpushare's devices on DRA nodes.

On a node in DRA mode the scheduler places shares itself: the node publishes, per GPU, a counter
set and the devices that consume it (a whole GPU, 1/N share slots, one exact-size device and one
spot device), and kubelet calls ``NodePrepareResources`` with the claims the scheduler allocated.
Prepared claims name the vendor's own CDI device for the GPU, so a container gets exactly the
edits the vendor's stack gives it. See docs/dra.md.

Decision code (``inventory``, ``pool``, ``claims``) is plain functions over plain data; the
gRPC services (``node_service``), the ResourceSlice publisher (``publisher``), the checkpoint and
the CDI files are the I/O around them.
"""
