"""What stands in for NVIDIA's hardware and kernel driver, so NVIDIA's own user-space runs here.

NVIDIA's k8s-device-plugin and the NVIDIA Container Toolkit (``nvidia-ctk cdi generate``,
``nvidia-container-runtime``, ``nvidia-cdi-hook``) are the real peers; these are the only fakes
under them:

    mock_nvml/        libnvidia-ml.so.1 in C: the NVML calls those peers make, on 8 configurable
                      GPUs, with XID health events a test fires through a directory
    stubs/            the C of the stub driver libraries and tools a driver root will hold
    build             compiles both with the system ``cc``, cached by a hash of the sources
    gpus              the mock's configuration: how many GPUs, their names, the driver version
    health            firing an XID on a GPU, and seeing that a waiter took it

Not part of the product: the wheel ships gpushare's own packages only.
"""
