"""Making a GPU of the mock NVML report an XID, the way a failing GPU makes the real driver report one.

``fire_xid(events_dir, 3, 79)`` writes one event file into the mock's events directory;
``nvmlEventSetWait_v2`` in whichever process waits on an event set that registered GPU 3 for XID
events (the device plugin's health check does) returns it, and renames the file to
``<name>.delivered``, which ``wait_delivered`` watches for. fakenvidia/mock_nvml/events.c holds the
other side of this protocol and says what is deliberately unlike the real driver.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from fakenvidia.errors import FakeNvidiaError

EVENT_SUFFIX = ".event"
DELIVERED_SUFFIX = ".delivered"
INVALID_SUFFIX = ".invalid"
# NVML reports an XID as a 64-bit value; the mock takes any that fits 32 bits, as every real XID does.
MAX_XID = 2**32 - 1

# Per process: with the clock and the pid it makes every name unique and sorts them in firing order.
_sequence = itertools.count()


def fire_xid(events_dir: Path, gpu: int | str, xid: int) -> Path:
    """Queue XID ``xid`` on ``gpu`` (its NVML index, or its ``GPU-...`` UUID); returns the event file."""
    if isinstance(gpu, int):
        if gpu < 0:
            raise FakeNvidiaError(f"fakenvidia: GPU index {gpu} is negative")
        target = f"gpu = {gpu}"
    elif gpu.startswith("GPU-") and gpu.isprintable() and gpu == gpu.strip():
        target = f"uuid = {gpu}"
    else:
        raise FakeNvidiaError(f"fakenvidia: {gpu!r} is neither a GPU index nor a GPU UUID")
    if not 0 <= xid <= MAX_XID:
        raise FakeNvidiaError(f"fakenvidia: XID {xid} is outside 0..{MAX_XID}")

    events_dir.mkdir(parents=True, exist_ok=True)
    name = f"{time.time_ns():020d}-{os.getpid()}-{next(_sequence):06d}{EVENT_SUFFIX}"
    # The mock skips names that start with a dot, so the file appears to it whole, by the rename.
    scratch = events_dir / f".{name}.tmp"
    scratch.write_text(f"{target}\nxid = {xid}\n")
    event = events_dir / name
    os.replace(scratch, event)
    return event


def delivered_path(event: Path) -> Path:
    return event.with_name(event.name + DELIVERED_SUFFIX)


def invalid_path(event: Path) -> Path:
    return event.with_name(event.name + INVALID_SUFFIX)


def wait_delivered(event: Path, timeout_s: float, poll_s: float = 0.02) -> bool:
    """True once a waiter of the mock has taken ``event``; False if none has within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not delivered_path(event).exists():
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)
    return True
