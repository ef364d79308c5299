"""The compress flow: ``python -m flows.compress --model NAME[:VERSION|@alias]``.

The names below are imported on first use (PEP 562): importing the package's ``cli`` does
not import the flow, torch or Lightning.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from flows.cli import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
