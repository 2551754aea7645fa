"""``NodeGpuParts``: the node's ``GpuPartRule``, read again whenever a CDI spec file changes.

The rule needs the node's CDI specs, which change while the agent runs: the operator regenerates
``nvidia.yaml`` after a driver upgrade, and NVIDIA's device plugin writes its own spec when it
starts. A container's part is read when the container is learnt, against the specs containerd
resolved it from a moment before, so each read checks the spec files' names, sizes and mtimes
(one ``scandir`` per directory) and parses only when they changed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from gpushare.cdi import CdiRegistry, dirs_signature, read_spec_dirs
from gpushare.config import Config
from gpushare.log import kv
from nri_plugin.model import GpuPartRule

log = logging.getLogger(__name__)


class NodeGpuParts:
    def __init__(
        self, visibility_env: Iterable[str], device_list_dirs: Iterable[str] = (), cdi_spec_dirs: Iterable[str] = ()
    ) -> None:
        self._visibility_env = frozenset(visibility_env)
        self._device_list_dirs = tuple(device_list_dirs)
        self._cdi_spec_dirs = tuple(cdi_spec_dirs)
        self._lock = threading.Lock()
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._rule = GpuPartRule(self._visibility_env, self._device_list_dirs, CdiRegistry())

    @classmethod
    def from_config(cls, config: Config) -> NodeGpuParts:
        return cls(config.visibility_env, config.device_list_dirs, config.cdi_spec_dirs)

    def rule(self) -> GpuPartRule:
        signature = dirs_signature(self._cdi_spec_dirs)
        if signature == self._signature:
            return self._rule
        with self._lock:
            if signature != self._signature:
                registry = read_spec_dirs(self._cdi_spec_dirs)
                for problem in registry.skipped:
                    log.warning("cdi: spec not loaded", extra=kv(reason=problem))
                log.info(
                    "cdi: specs read",
                    extra=kv(dirs=",".join(self._cdi_spec_dirs), devices=len(registry.devices)),
                )
                self._rule = GpuPartRule(self._visibility_env, self._device_list_dirs, registry)
                self._signature = signature
            return self._rule

    @property
    def registry(self) -> CdiRegistry:
        return self.rule().cdi
