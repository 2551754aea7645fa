"""The two gRPC services kubelet talks to: plugin registration and the DRA v1 node service.

The DRA socket is served first and the registration socket created after it, as kubelet expects
(it dials the endpoint as soon as the registration socket appears). Both live as long as the
process; a kubelet restart re-reads the registration directory and calls ``GetInfo`` again.
"""

from __future__ import annotations

import contextlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from draplugin._pb import dra_pb2, dra_pb2_grpc, registration_pb2, registration_pb2_grpc
from draplugin.claims import ClaimRef, PreparedClaim
from draplugin.driver import Driver
from gpushare.log import kv

log = logging.getLogger(__name__)

PLUGIN_TYPE = "DRAPlugin"
# kubelet takes the first entry it knows.
SUPPORTED_VERSIONS = ("v1.DRAPlugin",)
DRA_SOCKET = "dra.sock"


def registration_socket_name(driver: str) -> str:
    return f"{driver}-reg.sock"


def _refs(claims: Any) -> list[ClaimRef]:
    return [ClaimRef(c.namespace, c.name, c.uid) for c in claims]


class _DraService(dra_pb2_grpc.DRAPluginServicer):
    def __init__(self, driver: Driver) -> None:
        self._driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 -- gRPC method name
        response = dra_pb2.NodePrepareResourcesResponse()
        for uid, outcome in self._driver.prepare(_refs(request.claims)).items():
            entry = response.claims[uid]
            if isinstance(outcome, PreparedClaim):
                for d in outcome.devices:
                    device = entry.devices.add(
                        request_names=[d.request] if d.request else [],
                        pool_name=self._driver.pool,
                        device_name=d.device,
                        cdi_device_ids=list(d.cdi_ids),
                    )
                    if d.share_id:
                        device.share_id = d.share_id
            else:
                entry.error = outcome
        return response

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:  # noqa: N802 -- gRPC method name
        response = dra_pb2.NodeUnprepareResourcesResponse()
        for uid, error in self._driver.unprepare(_refs(request.claims)).items():
            response.claims[uid].error = error
        return response


class _Registration(registration_pb2_grpc.RegistrationServicer):
    def __init__(self, driver: str, endpoint: str) -> None:
        self._driver = driver
        self._endpoint = endpoint
        self.registered = False

    def GetInfo(self, request: Any, context: Any) -> Any:  # noqa: N802 -- gRPC method name
        return registration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=self._driver, endpoint=self._endpoint, supported_versions=list(SUPPORTED_VERSIONS)
        )

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:  # noqa: N802 -- gRPC method name
        self.registered = bool(request.plugin_registered)
        if request.plugin_registered:
            log.info("registered with kubelet %s", kv(driver=self._driver))
        else:
            log.error("kubelet refused the plugin %s", kv(driver=self._driver, error=request.error))
        return registration_pb2.RegistrationStatusResponse()


def _listen(server: grpc.Server, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    server.add_insecure_port(f"unix:{path}")


class NodeService:
    """Both servers; ``start`` serves the DRA socket, then the registration socket."""

    def __init__(self, driver: Driver, *, plugin_dir: Path, registry_dir: Path, workers: int = 4) -> None:
        self.dra_socket = plugin_dir / DRA_SOCKET
        self.registration_socket = registry_dir / registration_socket_name(driver.driver)
        self._dra = grpc.server(ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dra"))
        dra_pb2_grpc.add_DRAPluginServicer_to_server(_DraService(driver), self._dra)  # type: ignore[no-untyped-call]
        self._reg = grpc.server(ThreadPoolExecutor(max_workers=1, thread_name_prefix="dra-reg"))
        self._registration = _Registration(driver.driver, str(self.dra_socket))
        registration_pb2_grpc.add_RegistrationServicer_to_server(  # type: ignore[no-untyped-call]
            self._registration, self._reg
        )

    @property
    def registered(self) -> bool:
        """Whether kubelet last said it registered the plugin."""
        return self._registration.registered

    def start(self) -> None:
        _listen(self._dra, self.dra_socket)
        self._dra.start()
        _listen(self._reg, self.registration_socket)
        self._reg.start()
        log.info("serving %s", kv(dra=str(self.dra_socket), registration=str(self.registration_socket)))

    def stop(self, grace_s: float = 1.0) -> None:
        # The registration socket goes first, so kubelet stops dialing before the service ends.
        self._reg.stop(grace_s).wait()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.registration_socket)
        self._dra.stop(grace_s).wait()
