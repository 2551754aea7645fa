"""``python -m fakenvidia``: build the fakes, make a driver root, fire an XID.

Commands:

    python -m fakenvidia build                       compile the mock NVML and the stubs (make deps)
    python -m fakenvidia root PATH [--count N] [--name NAME] [--uuid-seed SEED]
    python -m fakenvidia xid EVENTS_DIR GPU XID      GPU: an index or a GPU-... UUID
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fakenvidia.driver_root import build_all, build_driver_root
from fakenvidia.errors import FakeNvidiaError
from fakenvidia.gpus import DEFAULT_NAME, FakeGpus
from fakenvidia.health import fire_xid


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fakenvidia", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="compile the mock NVML and the stub libraries and tools")
    root = commands.add_parser("root", help="make a fake driver root at PATH (as root)")
    root.add_argument("path", type=Path)
    root.add_argument("--count", type=int, default=8)
    root.add_argument("--name", default=DEFAULT_NAME)
    root.add_argument("--uuid-seed", default="gpushare")
    xid = commands.add_parser("xid", help="make a GPU of the mock report an XID")
    xid.add_argument("events_dir", type=Path)
    xid.add_argument("gpu", help="the GPU's NVML index or its GPU-... UUID")
    xid.add_argument("xid", type=int)
    args = parser.parse_args(argv)

    try:
        if args.command == "build":
            for path in build_all():
                print(path)
        elif args.command == "root":
            gpus = FakeGpus(count=args.count, name=args.name, uuid_seed=args.uuid_seed)
            driver = build_driver_root(args.path, gpus)
            print(f"driver root: {driver.path}")
            print(f"NVML:        {driver.nvml_library}")
            print(f"events:      {driver.events_dir}")
        else:
            gpu: int | str = int(args.gpu) if args.gpu.isdigit() else args.gpu
            print(fire_xid(args.events_dir, gpu, args.xid))
    except FakeNvidiaError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
