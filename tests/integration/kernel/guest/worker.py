"""A process that issues ioctls on command, run inside the QEMU guest (often in a new pid
namespace via ``unshare -p -f``). Line protocol on stdin/stdout:

    -> "pidns"                  <- "pidns <inode>"
    -> "ioctl <type> <nr> <k>"  <- "done <errno> <seconds> ..." (k threads at once, one time each)
    -> "exec <path>"            <- "done <exit status> <seconds>" (a 32-bit ioctl program)
    -> "exit"

Any fd works for the hook: the ioctl runs the hook first, then fails with ENOTTY on
/dev/null, which is fine. The time is measured here, from just before the ioctl to its
return, so it is the owner's stall.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time


def _ioc(direction: int, ioc_type: int, nr: int, size: int) -> int:
    return (direction << 30) | (size << 16) | (ioc_type << 8) | nr


def _one(fd: int, cmd: int, out: list[tuple[int, float]], i: int) -> None:
    start = time.monotonic()
    try:
        fcntl.ioctl(fd, cmd, 0)
        code = 0
    except OSError as exc:
        code = exc.errno or 0
    out[i] = (code, time.monotonic() - start)


def main() -> None:
    fd = os.open("/dev/null", os.O_RDONLY)
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "exit":
            break
        if words[0] == "pidns":
            print(f"pidns {os.stat('/proc/self/ns/pid').st_ino}", flush=True)
        elif words[0] == "ioctl":
            cmd = _ioc(0, int(words[1], 0), int(words[2], 0), 0)
            k = int(words[3]) if len(words) > 3 else 1
            results: list[tuple[int, float]] = [(0, 0.0)] * k
            threads = [threading.Thread(target=_one, args=(fd, cmd, results, i)) for i in range(k)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            print("done " + " ".join(f"{c} {s:.6f}" for c, s in results), flush=True)
        elif words[0] == "exec":
            start = time.monotonic()
            rc = subprocess.run([words[1]], stdin=subprocess.DEVNULL, check=False).returncode
            print(f"done {rc} {time.monotonic() - start:.6f}", flush=True)


if __name__ == "__main__":
    main()
