"""gpukmod.c is checkpatch-clean (`checkpatch.pl --strict --no-tree`) and builds warning-free on both kernels."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest

from gpukmod.module import SOURCE_DIR, build_module
from localcluster.paths import cache_dir

CACHE = cache_dir() / "kernel"
CHECKPATCH = CACHE / "checkpatch" / "scripts" / "checkpatch.pl"
RELEASES = ["6.1.0-50-amd64", "6.12.95+deb12-amd64"]


def test_checkpatch_strict_clean() -> None:
    if not CHECKPATCH.exists():
        pytest.skip(f"{CHECKPATCH} missing; run `make kernels` (hack/kernel/fetch.sh)")
    proc = subprocess.run(
        ["perl", str(CHECKPATCH), "--no-tree", "--strict", "--no-summary", "--terse", "-f", SOURCE_DIR / "gpukmod.c"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize("release", RELEASES)
def test_module_builds_without_warnings(release: str) -> None:
    headers = CACHE / release / "root" / "usr" / "src" / f"linux-headers-{release}"
    if not headers.exists():
        pytest.skip(f"headers for {release} missing; run `make kernels` (hack/kernel/fetch.sh)")
    with tempfile.TemporaryDirectory(prefix="gs-kb-") as out:
        ko = build_module(headers, Path(out), werror=True)
        assert ko.stat().st_size > 0
