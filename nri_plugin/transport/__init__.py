"""NRI transport: the connection multiplexer and ttrpc. Bytes and method names only."""

from nri_plugin.transport.mux import Mux, MuxDecoder, encode_frames
from nri_plugin.transport.ttrpc import Code, MessageDecoder, TtrpcClient, TtrpcServer, encode_message

__all__ = [
    "Code",
    "MessageDecoder",
    "Mux",
    "MuxDecoder",
    "TtrpcClient",
    "TtrpcServer",
    "encode_frames",
    "encode_message",
]
