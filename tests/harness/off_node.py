"""Clients of the agent's endpoint that come from off the node, on the one machine the tests have.

The harness's agents listen on 127.0.0.1, and the node is that machine, so every client the tests
had was a loopback one, which the endpoint treats as the node itself. ``off_node_addresses`` adds
addresses of 198.18.0.0/15 (the benchmarking range, never routed) to the loopback interface for the
length of a test; a client that binds one of them before it connects reaches 127.0.0.1 with that
address as its source, which is what the agent sees of a client on another machine. Root only, as
every tier that runs a cluster.

kubelet, where iptables is installed, adds a rule to its KUBE-FIREWALL chain that drops any packet
to 127.0.0.0/8 from a source outside it (its "martian" protection for kube-proxy's route_localnet),
which is exactly what these clients send. So, where iptables exists, the range is accepted by a rule
at the head of that chain for the length of the test (``_accept_in_kube_firewall``): kubelet only
appends its rule and only prepends the jump to the chain, so the acceptance stays ahead of the drop
whichever started first.

``get`` sends one request from such an address; ``SlowClients`` holds many connections from them,
each sending its request head a byte at a time and never finishing it (slowloris), and opens a
connection again a moment after the agent closes it.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import resource
import selectors
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

_RANGE_SECOND_OCTET = 18  # 198.18.0.0/15: the first /16 of the two


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=10)
    if res.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)} failed: {res.stderr.strip()} (the tests run as root)")


_FIREWALL = "KUBE-FIREWALL"


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False, timeout=30)


@contextlib.contextmanager
def _accept_in_kube_firewall(subnet: str) -> Iterator[None]:
    """Accept ``subnet`` to 127.0.0.0/8 ahead of kubelet's drop (module docstring); nothing without
    iptables. One rule per process's subnet, so lanes side by side never remove each other's."""
    if shutil.which("iptables") is None:
        yield
        return
    accept = ["-s", subnet, "-d", "127.0.0.0/8", "-m", "comment", "--comment", "gpushare tests", "-j", "ACCEPT"]
    _iptables("-N", _FIREWALL)  # exists already where kubelet ran: then this fails, harmlessly
    res = _iptables("-I", _FIREWALL, "1", *accept)
    if res.returncode != 0:
        raise AssertionError(f"iptables -I {_FIREWALL} failed: {res.stderr.strip()} (the tests run as root)")
    try:
        yield
    finally:
        _iptables("-D", _FIREWALL, *accept)


@contextlib.contextmanager
def off_node_addresses(count: int) -> Iterator[list[str]]:
    """``count`` addresses on the loopback interface that are not loopback addresses, removed after.

    The third octet comes from this process's id, so test lanes running side by side use their own.
    """
    third = os.getpid() % 250 + 1
    addresses = [f"198.{_RANGE_SECOND_OCTET}.{third}.{i + 1}" for i in range(count)]
    added: list[str] = []
    try:
        for address in addresses:
            _ip("addr", "add", f"{address}/32", "dev", "lo")
            added.append(address)
        with _accept_in_kube_firewall(f"198.{_RANGE_SECOND_OCTET}.{third}.0/24"):
            yield addresses
    finally:
        for address in added:
            with contextlib.suppress(AssertionError):
                _ip("addr", "del", f"{address}/32", "dev", "lo")


def get(
    port: int, path: str, *, source: str, token: str | None = None, timeout_s: float = 5.0
) -> tuple[int, dict[str, str], bytes]:
    """One GET of the agent at 127.0.0.1:``port`` from ``source``: status, headers, body."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s, source_address=(source, 0))
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


@dataclass
class SlowStats:
    opened: int = 0  # connect() calls
    answered_503: int = 0  # refused at once by the agent, with its 503
    answered_other: int = 0  # another status line (a 408 when the head took too long)
    closed_silently: int = 0  # closed or reset without an answer
    connect_errors: int = 0


class SlowClients:
    """``per_source`` slowloris connections from each of ``sources`` to 127.0.0.1:``port``.

    One thread, non-blocking sockets: every ``trickle_s`` each open connection sends one more byte
    of a header line that never ends; a connection the agent closes is opened again ``reconnect_s``
    later, so the pressure lasts as long as the clients run. At most ``connect_rate`` connections
    are opened a second, as an attacker ramps up: a burst all at once would overflow the server's
    accept queue, and the kernel's SYN retries (1 s, 3 s, 7 s, ...) would then spread it over
    minutes, whatever the server does.
    """

    HEAD = b"GET /metrics HTTP/1.1\r\nHost: gpushare-agent\r\nX-Slow: "

    def __init__(
        self,
        port: int,
        sources: Sequence[str],
        per_source: int,
        *,
        trickle_s: float = 1.0,
        reconnect_s: float = 1.0,
        connect_rate: float = 200.0,
    ) -> None:
        self.port = port
        self.wanted = [source for source in sources for _ in range(per_source)]
        self.trickle_s = trickle_s
        self.reconnect_s = reconnect_s
        self.connect_rate = connect_rate
        self.stats = SlowStats()
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-slow-clients", daemon=True)
        self._rlimit = resource.getrlimit(resource.RLIMIT_NOFILE)

    def __enter__(self) -> SlowClients:
        soft, hard = self._rlimit
        need = len(self.wanted) + 512
        if soft != resource.RLIM_INFINITY and soft < need:
            if hard != resource.RLIM_INFINITY and hard < need:
                raise AssertionError(f"the test needs {need} open files and may have only {hard}")
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        resource.setrlimit(resource.RLIMIT_NOFILE, self._rlimit)

    def open_now(self) -> int:
        return len(self._selector.get_map())

    def _connect(self, source: str) -> None:
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.bind((source, 0))
            code = sock.connect_ex(("127.0.0.1", self.port))
        except OSError:
            sock.close()
            self.stats.connect_errors += 1
            return
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.stats.connect_errors += 1
            return
        self.stats.opened += 1
        self._selector.register(sock, selectors.EVENT_READ, [source, False])

    def _closed(self, sock: socket.socket, source: str, due: list[tuple[float, str]], first: bytes) -> None:
        if first.startswith(b"HTTP/1.1 503"):
            self.stats.answered_503 += 1
        elif first.startswith(b"HTTP/"):
            self.stats.answered_other += 1
        else:
            self.stats.closed_silently += 1
        self._selector.unregister(sock)
        sock.close()
        due.append((time.monotonic() + self.reconnect_s, source))

    def _run(self) -> None:
        due = [(0.0, source) for source in self.wanted]
        next_trickle = started = time.monotonic()
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                allowed = int((now - started) * self.connect_rate) + 1 - self.stats.opened - self.stats.connect_errors
                ready = sorted(d for d in due if d[0] <= now)[: max(0, allowed)]
                for entry in ready:
                    due.remove(entry)
                for _, source in ready:
                    self._connect(source)
                if now >= next_trickle:
                    next_trickle = now + self.trickle_s
                    for key in list(self._selector.get_map().values()):
                        state = key.data
                        with contextlib.suppress(OSError):
                            key.fileobj.send(b"a" if state[1] else self.HEAD)  # type: ignore[union-attr]
                            state[1] = True
                for key, _ in self._selector.select(timeout=0.05):
                    sock = key.fileobj
                    assert isinstance(sock, socket.socket)
                    try:
                        data = sock.recv(4096)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    self._closed(sock, key.data[0], due, data)
        finally:
            for key in list(self._selector.get_map().values()):
                with contextlib.suppress(OSError):
                    key.fileobj.close()  # type: ignore[union-attr]
            self._selector.close()


__all__ = ["SlowClients", "SlowStats", "get", "off_node_addresses"]
