"""``python -m flows.compress --model NAME[:VERSION|@alias] [...]``: one command, flags from the flow."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flows.cli import Command, make_main
from infra.registry import ModelRegistry
from solutions.fraud.config import FraudHeldOut
from solutions.sensor.config import SensorHeldOut

if TYPE_CHECKING:
    from flows.compress.results import CompressResult

#: The flow, by entrypoint: imported only when the command runs (see flows/cli.py).
COMPRESS = "flows.compress.flow:model_compress"

#: Flags every adapter shares: given once, as the fraud options, and copied to the others.
_SHARED = ("sensor_data.data", "sensor_data.columns", "sensor_data.fleet.seed")


def share_data_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``--data``, ``--columns`` and ``--seed`` apply to whichever adapter the model has."""
    fraud = kwargs.get("fraud_data", FraudHeldOut())
    sensor = kwargs.get("sensor_data", SensorHeldOut())
    fleet = sensor.fleet.model_copy(update={"seed": fraud.synthetic.seed})
    sensor = sensor.model_copy(update={"data": fraud.data, "columns": dict(fraud.columns), "fleet": fleet})
    return {**kwargs, "fraud_data": fraud, "sensor_data": sensor}


def check(kwargs: dict[str, Any]) -> None:
    """The model is registered, its architecture has an adapter, and the adapter accepts the data options."""
    shared = share_data_options(kwargs)
    ref = ModelRegistry().resolve(kwargs["model"])  # RegistryError names the registered models
    from flows.compress.adapters import adapter_for, options_for

    adapter = adapter_for(ref)
    adapter.check(options_for(adapter, shared["fraud_data"], shared["sensor_data"]))


def summarize(r: CompressResult) -> str:
    """The human summary of a compression run."""
    from flows.compress.results import summarize as render

    return render(r)


COMMANDS = [
    Command(
        None, COMPRESS, summarize,
        flags={"config.try_all": "all", "config.register_variant": "no-register"},
        hidden=_SHARED, check=check, prepare=share_data_options,
        common=("fraud_data.columns", "config.tolerance", "config.try_all", "config.register_variant",
                "sensor_data.cmapss_dir", "sensor_data.subset"),
    ),
]

main = make_main("python -m flows.compress", "Compress a registered model: INT8, pruning, distillation; ONNX export.",
                 COMMANDS)
