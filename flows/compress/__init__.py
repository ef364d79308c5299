"""The compress flow: ``python -m flows.compress --model NAME[:VERSION|@alias]``."""

from __future__ import annotations

from flows.compress.flow import model_compress
from flows.compress.params import CompressConfig
from flows.compress.results import CompressResult

__all__ = ["CompressConfig", "CompressResult", "model_compress"]
