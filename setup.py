"""Cython build of the compiled core (``sfc_fast``); metadata lives in pyproject.toml."""

from __future__ import annotations

import os
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

HERE = Path(__file__).parent
SRC = HERE / "src" / "sfc_fast"

# Module-wide directives. Hot loops additionally drop bounds and wraparound checks
# with @cython.boundscheck(False) / @cython.wraparound(False) at the function, where
# the indexes have been validated (Graph.from_bytes checks every table); code that
# indexes Python lists keeps Python's checks.
DIRECTIVES = {
    "language_level": "3",
    "initializedcheck": False,
    "embedsignature": True,
}

if os.environ.get("SFC_PROFILE") == "1":
    DIRECTIVES["profile"] = True

debug = os.environ.get("SFC_DEBUG_BUILD") == "1"
cflags = ["-O0", "-g"] if debug else ["-O3"]

# SFC_BUILD_ONLY=evolve,mqtt5 rebuilds only those modules (a quick edit loop with
# `python setup.py build_ext --inplace`); unset, every module is built.
only = {m for m in os.environ.get("SFC_BUILD_ONLY", "").split(",") if m}

extensions = [
    Extension(
        ".".join(pyx.relative_to(SRC.parent).with_suffix("").parts),
        [str(pyx.relative_to(HERE))],
        extra_compile_args=cflags,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for pyx in sorted(SRC.rglob("*.pyx"))
    if not only or pyx.stem in only
]

# SFC_BUILD_JOBS: the modules cythonized, and then compiled, at once (the C compiler
# takes most of a build: two at a time halve it on a two-core machine)
jobs = int(os.environ.get("SFC_BUILD_JOBS", "2"))

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives=DIRECTIVES,
        nthreads=jobs,
        annotate=os.environ.get("SFC_ANNOTATE") == "1",
    ),
    options={"build_ext": {"parallel": jobs}},
)
