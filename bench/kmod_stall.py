"""Owner stall with gpukmod: from GPU ioctl entry to return when user space releases as soon
as it reads the notice (issue 4). Runs as root where gpukmod.ko can load: the QEMU guest of
tests/integration/kernel/test_qemu.py runs it after the tests.

    python bench/kmod_stall.py --ko PATH [--count 200] [--json OUT]

Each round: ``detect`` the worker's pid namespace, the worker (pid 1 of a new pid namespace)
issues one 0x46 ioctl and times it; a listener thread releases on the notice. Prints p50/p99
and their ratio to the seed system's fixed 3000 ms stall.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpukmod import KmodClient
from tests.integration.kernel.guest.common import module_loaded, worker

SEED_STALL_MS = 3000.0


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, round(pct / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


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
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--backend", default="native")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    stalls = measure(args.ko, args.count, args.backend)
    held = [s for s in stalls if s < SEED_STALL_MS * 0.9]
    result = {
        "count": len(stalls),
        "p50_ms": round(statistics.median(stalls), 3),
        "p99_ms": round(percentile(stalls, 99), 3),
        "max_ms": round(max(stalls), 3),
        "timeouts": len(stalls) - len(held),
        "p50_ratio_to_3000ms": round(statistics.median(stalls) / SEED_STALL_MS, 5),
        "p99_ratio_to_3000ms": round(percentile(stalls, 99) / SEED_STALL_MS, 5),
        "backend": args.backend,
    }
    print(
        f"kmod_stall: n={result['count']} p50={result['p50_ms']:.2f} ms p99={result['p99_ms']:.2f} ms "
        f"max={result['max_ms']:.2f} ms timeouts={result['timeouts']} "
        f"ratio to seed 3000 ms: p50={result['p50_ratio_to_3000ms']:.4f} p99={result['p99_ratio_to_3000ms']:.4f}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
