"""Whether sharing, lending and Docker-in-Docker work with NVIDIA's stack in a node's mode, and why.

Three facts decide it: how NVIDIA's device plugin answers ``Allocate`` (its
``--device-list-strategy``), what puts the GPU into a container (containerd's own CDI support
under plain runc, or ``nvidia-container-runtime`` in ``cdi`` or ``jit-cdi`` mode), and the
containerd version (whether NRI can name CDI devices in an adjustment). The verdicts below are the
ones the NVIDIA tier measures on real containerd 1.7.24 and 2.4.2 with the real device plugin
v0.17.4 and toolkit v1.20.2 (tests/integration/nvidia/test_gpu_parts.py asserts each against the
OCI spec runc gets, and writes the table in docs/nvidia.md from them); ``gpushare doctor`` says the
same words for the mode it finds.

Pure: plain values in, a verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

STRATEGIES = ("envvar", "volume-mounts", "cdi-annotations", "cdi-cri")
CDI_STRATEGIES = ("cdi-annotations", "cdi-cri")
# How the node puts the GPU into a container: plain runc with containerd's CDI, or NVIDIA's runtime.
NATIVE_CDI = "native-cdi"
RUNTIME_CDI = "runtime-cdi"
RUNTIME_JIT_CDI = "runtime-jit-cdi"
RUNTIME_LEGACY = "runtime-legacy"
# NVIDIA's hardened mode: accept-nvidia-visible-devices-envvar-when-unprivileged = false.
RUNTIME_CDI_HARDENED = "runtime-cdi-hardened"
RUNTIME_MODES = (NATIVE_CDI, RUNTIME_CDI, RUNTIME_JIT_CDI, RUNTIME_CDI_HARDENED)
_MODE_WORDS = {RUNTIME_CDI: "cdi mode", RUNTIME_JIT_CDI: "jit-cdi mode", RUNTIME_CDI_HARDENED: "cdi mode, hardened"}


@dataclass(frozen=True)
class NvidiaVerdict:
    """``exclusive``: an exclusive pod gets its GPU; ``same``: a sharer, borrower or DinD target gets
    exactly the exclusive pod's GPU part (``None``: not measured); ``how`` says by what, ``note`` any
    difference, ``fix`` what to change where it does not work."""

    exclusive: bool
    same: bool | None
    how: str
    note: str = ""
    fix: str = ""

    @property
    def works(self) -> bool:
        return self.exclusive and self.same is not False


def nvidia_verdict(strategy: str, runtime: str, containerd_major: int) -> NvidiaVerdict:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown device-list strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    if runtime == RUNTIME_LEGACY:
        return NvidiaVerdict(
            exclusive=True,
            same=None,
            how="nvidia-container-runtime's legacy prestart hook (nvidia-container-cli) adds the GPU",
            note="not measured: the hook needs libnvidia-container, which is not built here; gpushare gives "
            "the target the same visibility variable and device-list mounts, which the hook reads",
            fix="run the runtime in cdi mode (GPU Operator: CDI enabled) to be on a measured mode",
        )
    if runtime not in RUNTIME_MODES:
        raise ValueError(f"unknown runtime mode {runtime!r} (one of {', '.join((*RUNTIME_MODES, RUNTIME_LEGACY))})")
    if strategy in CDI_STRATEGIES:
        if containerd_major >= 2:
            return NvidiaVerdict(
                True,
                True,
                "containerd resolves the plugin's CDI names; gpushare names the same CDI devices for the target",
            )
        return NvidiaVerdict(
            True,
            True,
            "containerd resolves the plugin's CDI names; gpushare copies their edits to the target",
            note="containerd 1.7's NRI cannot name CDI devices or grant mknod: the target's device rules are "
            "rw where the exclusive pod's are rwm (CUDA does not mknod)",
        )
    if runtime == RUNTIME_CDI_HARDENED and strategy == "envvar":
        return NvidiaVerdict(
            False,
            True,
            "nothing: the runtime's hardened mode ignores NVIDIA_VISIBLE_DEVICES in unprivileged containers",
            fix="set the device plugin's --device-list-strategy to volume-mounts (what the hardened mode reads) "
            "or cdi-cri",
        )
    if runtime == NATIVE_CDI:
        return NvidiaVerdict(
            False,
            True,
            "nothing: plain runc reads neither NVIDIA_VISIBLE_DEVICES nor the device-list mounts",
            fix="set the device plugin's --device-list-strategy to cdi-cri, or run nvidia-container-runtime "
            "(cdi mode) as the GPU pods' runtime",
        )
    return NvidiaVerdict(
        True,
        True,
        f"nvidia-container-runtime ({_MODE_WORDS[runtime]}) adds the GPU at start from the "
        f"{'variable' if strategy == 'envvar' else 'device-list mounts'}; gpushare gives the target the same request",
        note="a sharer's pod must run under the same runtime (the node's default, or the same RuntimeClass)",
    )


def strategy_of_answer(
    envs: dict[str, str],
    mount_paths: list[str],
    annotation_keys: list[str],
    cdi_devices: list[str],
    device_list_dirs: tuple[str, ...],
) -> str | None:
    """The device-list strategy an NVIDIA plugin's ``Allocate`` answer was written in, or None when it
    is none of the four (not NVIDIA's plugin, or a variant gpushare does not know)."""
    if cdi_devices:
        return "cdi-cri"
    if any(k.startswith("cdi.k8s.io/") for k in annotation_keys):
        return "cdi-annotations"
    if any(p.startswith(d.rstrip("/") + "/") for p in mount_paths for d in device_list_dirs):
        return "volume-mounts"
    if envs.get("NVIDIA_VISIBLE_DEVICES"):
        return "envvar"
    return None


def runtime_mode_of(binary: str, nvidia_mode: str | None, envvar_when_unprivileged: bool | None = None) -> str:
    """The runtime mode of a containerd runtime handler: its binary, and the NVIDIA runtime's
    configured ``nvidia-container-runtime.mode`` and ``accept-nvidia-visible-devices-envvar-when-unprivileged``
    when the binary is that runtime."""
    name = binary.rsplit("/", 1)[-1]
    if not name.startswith("nvidia-container-runtime"):
        return NATIVE_CDI
    # NVIDIA ships nvidia-container-runtime.cdi and .legacy, each fixed to its mode.
    forced = name.removeprefix("nvidia-container-runtime").removeprefix(".")
    mode = forced or nvidia_mode or "auto"
    if mode == "cdi" and envvar_when_unprivileged is False:
        return RUNTIME_CDI_HARDENED
    return {"cdi": RUNTIME_CDI, "jit-cdi": RUNTIME_JIT_CDI}.get(mode, RUNTIME_LEGACY)
