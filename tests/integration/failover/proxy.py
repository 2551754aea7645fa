"""A TCP proxy in front of the API server that a test can cut, as a network partition would.

``cut()`` turns it into a black hole: bytes already in flight and every new connection are
swallowed without an answer or a reset, so the client learns nothing until its own timeouts
fire. ``restore()`` drops the connections the cut broke and forwards new ones again.
Not a test module itself.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class CuttableProxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._cut = False
        self._generation = 0  # connections of an older generation are closed
        self._conns: list[tuple[int, socket.socket]] = []
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            self._cut = True

    def restore(self) -> None:
        with self._lock:
            self._cut = False
            self._generation += 1
            old, self._conns = self._conns, []
        for _, s in old:
            with contextlib.suppress(OSError):
                s.close()

    def close(self) -> None:
        self._closed = True
        self.restore()
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                gen, cut = self._generation, self._cut
                self._conns.append((gen, client))
            if cut:
                threading.Thread(target=self._swallow, args=(client,), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._conns.append((gen, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _swallow(self, s: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while s.recv(65536):
                pass

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if self._cut:
                    continue  # swallowed: neither side hears of it
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
