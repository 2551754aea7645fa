"""Owner stall with gpukmod: from GPU ioctl entry to return when user space releases as soon
as it reads the notice. Runs as root where gpukmod.ko can load: the QEMU guest of
tests/integration/kernel/test_qemu.py runs it after the tests.

    python bench/kmod_stall.py --ko PATH [--count 200] [--quick] [--json OUT]

Each round: ``detect`` the worker's pid namespace, the worker (pid 1 of a new pid namespace)
issues one 0x46 ioctl and times it; a listener thread releases on the notice. Prints p50/p99
(nearest rank, bench/stats.py; p99 is n/a, JSON null, below 200 rounds) and their ratio to the
seed system's fixed 3000 ms stall.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.stats import format_percentile, median, tail_percentile
from gpukmod import KmodClient
from tests.integration.kernel.guest.common import module_loaded, worker

SEED_STALL_MS = 3000.0
COUNT = 200
QUICK_COUNT = 20


def measure(ko: Path, count: int, backend: str) -> list[float]:
    stalls_ms: list[float] = []
    with module_loaded(max_block_ms=int(SEED_STALL_MS), ko=ko), worker() as w:
        listener = KmodClient(backend=backend)
        ctl = KmodClient(backend=backend)
        try:
            listener.register()
            ctl.add(w.pidns)
            # Release straight from the notice callback: "as soon as it reads the notice".
            listener.start_notices(ctl.release, name="gpushare-kmod-bench")
            for _ in range(count):
                ctl.detect(w.pidns)
                ((_, stall_s),) = w.ioctl()
                stalls_ms.append(stall_s * 1000)
        finally:
            listener.close()
            ctl.close()
    return stalls_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ko", type=Path, required=True)
    parser.add_argument("--count", type=int, default=None, help=f"rounds (default {COUNT})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK_COUNT} rounds (p99 n/a)")
    parser.add_argument("--backend", default="native")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stalls = measure(args.ko, args.count or (QUICK_COUNT if args.quick else COUNT), args.backend)
    held = [s for s in stalls if s < SEED_STALL_MS * 0.9]
    p50, p99 = median(stalls), tail_percentile(stalls, 99)
    result = {
        "count": len(stalls),
        "p50_ms": round(p50, 3),
        "p99_ms": None if p99 is None else round(p99, 3),
        "max_ms": round(max(stalls), 3),
        "timeouts": len(stalls) - len(held),
        "p50_ratio_to_3000ms": round(p50 / SEED_STALL_MS, 5),
        "p99_ratio_to_3000ms": None if p99 is None else round(p99 / SEED_STALL_MS, 5),
        "backend": args.backend,
    }
    p99_ratio = "n/a" if p99 is None else f"{p99 / SEED_STALL_MS:.4f}"
    print(
        f"kmod_stall: n={result['count']} p50={p50:.2f} ms p99={format_percentile(stalls, 99, '.2f', ' ms')} "
        f"max={max(stalls):.2f} ms timeouts={result['timeouts']} "
        f"ratio to seed 3000 ms: p50={p50 / SEED_STALL_MS:.4f} p99={p99_ratio}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
