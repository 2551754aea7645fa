"""Only for the cffi extension: pyproject.toml is the metadata source (design §1)."""

from setuptools import setup  # type: ignore[import-untyped,unused-ignore]

setup(cffi_modules=["cffi_build/build_native.py:ffibuilder"])
