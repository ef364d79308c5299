"""The compress flow: ``python -m flows.compress --model NAME[:VERSION|@alias]``.

The names below are imported on first use (PEP 562): importing the package's ``cli`` does
not import the flow, torch or Lightning.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: exported name -> the module that defines it
_EXPORTS = {
    "CompressConfig": "flows.compress.params",
    "CompressResult": "flows.compress.results",
    "model_compress": "flows.compress.flow",
}

__all__ = [
    "CompressConfig",
    "CompressResult",
    "model_compress",
]

if TYPE_CHECKING:
    from flows.compress.flow import model_compress
    from flows.compress.params import CompressConfig
    from flows.compress.results import CompressResult


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
