"""The compression adapters the compress flow knows, chosen by the registry's ``architecture``.

An adapter is solution code (``solutions/<vertical>/compress.py``); a new model type
plugs in by adding its adapter here and its data options to the flow's parameters.
"""

from __future__ import annotations

from pydantic import BaseModel

from infra.compression import ModelAdapter
from infra.errors import RegistryError
from infra.registry import ModelRef
from solutions.fraud.compress import ADAPTER as FRAUD_ADAPTER
from solutions.sensor.compress import ADAPTER as SENSOR_ADAPTER
from solutions.sensor.compress import ENSEMBLE_ADAPTER as SENSOR_ENSEMBLE_ADAPTER

ADAPTERS: dict[str, ModelAdapter] = {a.architecture: a for a in (FRAUD_ADAPTER, SENSOR_ADAPTER, SENSOR_ENSEMBLE_ADAPTER)}


def adapter_for(ref: ModelRef) -> ModelAdapter:
    """The adapter of a registered model, from its params' ``architecture``."""
    arch = ref.params.get("architecture")
    if arch not in ADAPTERS:
        raise RegistryError(
            f"{ref.spec} has architecture {arch!r}; the compress flow compresses {', '.join(sorted(ADAPTERS))} "
            "(add a ModelAdapter to flows/compress/adapters.py)"
        )
    return ADAPTERS[arch]


def options_for(adapter: ModelAdapter, *options: BaseModel) -> BaseModel:
    """The one of ``options`` that is the adapter's data options model."""
    for value in options:
        if isinstance(value, adapter.options):
            return value
    raise TypeError(f"no {adapter.options.__name__} among the flow's data options")
