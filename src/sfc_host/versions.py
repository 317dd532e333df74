"""The versions ``sfc-host version`` reports: the package, Python, the client libraries
the host runs on and the compiled core (an operator reporting a problem, or checking a
wheel installed on a plant server, needs all of them at once)."""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import platform
from typing import Any

# (what the operator knows it as, its distribution name)
LIBRARIES = (("redis-py", "redis"), ("hiredis", "hiredis"), ("uvloop", "uvloop"))
DISTRIBUTION = "sfc-fast"


def package_version() -> str:
    """The installed distribution's version; a source tree run without an install
    falls back to the one the package declares."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        from sfc_host import __version__

        return __version__


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def core() -> dict[str, Any]:
    """The compiled core: its version and the extension tag its modules were built for
    (``None`` when they are not compiled extensions, e.g. a broken install)."""
    import sfc_fast

    # the module, not the function of that name the package exports
    path = str(getattr(importlib.import_module("sfc_fast.evolve"), "__file__", "") or "")
    tag = None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if path.endswith(suffix):
            # ".cpython-311-x86_64-linux-gnu.so" -> "cpython-311-x86_64-linux-gnu"
            tag = suffix.strip(".").removesuffix(".so").removesuffix(".pyd") or "abi-neutral"
            break
    return {"version": getattr(sfc_fast, "__version__", None), "compiled": tag is not None,
            "extension": tag}


def versions() -> dict[str, Any]:
    """Every version as one JSON-able document (``None``: not installed)."""
    return {"sfc-fast": package_version(),
            "python": f"{platform.python_version()} ({platform.python_implementation()})",
            **{label: _dist_version(dist) for label, dist in LIBRARIES},
            "sfc_fast": core()}


def versions_text(doc: dict[str, Any]) -> str:
    """One ``name version`` line each."""
    lines = []
    for name, v in doc.items():
        if name == "sfc_fast":
            built = f"compiled, {v['extension']}" if v["compiled"] else "NOT compiled"
            v = f"{v['version']} ({built})"
        lines.append(f"{name:<10} {'not installed' if v is None else v}")
    return "\n".join(lines)
