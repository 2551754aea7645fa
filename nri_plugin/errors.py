"""Errors of the NRI plugin.

GpushareError
├── InstructionRefused            (gpushare.errors) an annotation we must not act on; the
│                                 stub answers it as FAILED_PRECONDITION so containerd fails
│                                 only that container and the plugin stays connected
├── TransportError                the NRI socket, mux or ttrpc failed
│   ├── ProtocolError             the peer sent bytes we cannot accept (bad header, oversize,
│   │                             undecodable protobuf); the connection is dropped
│   ├── ConnectionClosed          the socket is gone (containerd stopped or restarted)
│   ├── DeadlineExceeded          a call or handshake step did not finish in time
│   └── RpcStatusError(code)      the peer answered a call with a non-OK status
└── NriError                      the plugin itself was misused or misconfigured
    └── OracleUnavailable         the AllocationOracle (PodResources) could not answer
"""

from __future__ import annotations

from gpushare.errors import GpushareError, InstructionRefused

__all__ = [
    "ConnectionClosed",
    "DeadlineExceeded",
    "InstructionRefused",
    "NriError",
    "OracleUnavailable",
    "ProtocolError",
    "RpcStatusError",
    "TransportError",
]


class TransportError(GpushareError):
    """The NRI connection failed; the stub reconnects with back-off."""


class ProtocolError(TransportError):
    """The peer broke the mux or ttrpc framing; the message quotes what was wrong."""


class ConnectionClosed(TransportError):
    """The socket was closed (EOF or error); containerd probably stopped or restarted."""


class DeadlineExceeded(TransportError):
    """A call or handshake step ran past its deadline."""


class RpcStatusError(TransportError):
    """The peer answered with a non-OK google.rpc status (gRPC code numbering)."""

    def __init__(self, code: int, message: str, method: str = "") -> None:
        self.code = code
        self.status_message = message
        self.method = method
        super().__init__(f"gpushare: {method or 'ttrpc call'} failed with status {code}: {message}")


class NriError(GpushareError):
    """The plugin was misused or misconfigured (e.g. a plugin object that handles no event)."""


class OracleUnavailable(NriError):
    """The AllocationOracle could not answer (PodResources socket down, timeout)."""
