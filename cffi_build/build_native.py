"""cffi out-of-line API build of the gpukmod C helper: ``gpukmod._native_c``.

setup.py's ``cffi_modules`` runs this at install time (``pip install -e .`` included), so the
extension is compiled on the machine that uses it. To rebuild in place: `make kmod-native`.
"""

from __future__ import annotations

from pathlib import Path

from cffi import FFI

HERE = Path(__file__).resolve().parent

ffibuilder = FFI()
ffibuilder.cdef((HERE / "gpukmod_helper.h").read_text().split("*/", 1)[1])
ffibuilder.set_source(
    "gpukmod._native_c",
    '#include "gpukmod_helper.h"',
    # setuptools wants source paths relative to the project root, where setup.py runs.
    sources=["cffi_build/gpukmod_helper.c"],
    include_dirs=["cffi_build"],
    extra_compile_args=["-O2", "-Wall", "-Wextra", "-Werror"],
)
