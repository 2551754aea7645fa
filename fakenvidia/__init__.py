"""What stands in for NVIDIA's hardware and kernel driver, so NVIDIA's own user-space runs here.

NVIDIA's k8s-device-plugin and the NVIDIA Container Toolkit (``nvidia-ctk cdi generate``,
``nvidia-container-runtime``, ``nvidia-cdi-hook``) are the real peers; these are the only fakes
under them (docs/fakenvidia.md):

    mock_nvml/        libnvidia-ml.so.1 in C: the NVML calls those peers make, on 8 configurable
                      GPUs, with XID health events a test fires through a directory
    stubs/            the C of the stub driver libraries and tools of a fake driver root
    build             compiles both with the system ``cc``, cached by a hash of the sources
    gpus              the mock's configuration: how many GPUs, their names, the driver version
    health            firing an XID on a GPU, and seeing that a waiter took it
    driver_root       a private directory shaped like an NVIDIA node's / : device nodes with
                      NVIDIA's numbers, versioned libraries, tools, firmware, an ld cache

Not part of the product: the wheel ships gpushare's own packages only, and an import contract in
.importlinter keeps the product from importing this.

    .venv/bin/python -m fakenvidia root /tmp/fake-nvidia    # build a driver root
    .venv/bin/python -m fakenvidia xid /tmp/fake-nvidia/run/gpushare-mock-nvml/events 3 79
"""
