"""What went into a registered model version: data, configuration, seeds, software, hardware.

:func:`collect_lineage` gathers it inside a flow run (the flow's parameters with every
default filled in, the flow run id) and from the machine (package versions, Python, OS,
CPU/GPU model, threads); the registration step stores it as ``lineage.json`` in the
version folder. :func:`environment_differences` compares a recorded environment with the
current one, which is what ``reproduce`` checks before it re-trains.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata as md
import inspect
import json
import logging
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import to_jsonable_python

from infra.registry import ModelRef, current_git_commit
from infra.resources import TrainerArgs

log = logging.getLogger(__name__)

LINEAGE_FILE = "lineage.json"
#: Distribution name -> the name shown in the lineage.
PACKAGES = {
    "torch": "torch",
    "lightning": "lightning",
    "prefect": "prefect",
    "scikit-learn": "sklearn",
    "pandas": "pandas",
    "numpy": "numpy",
    "indusflow": "indusflow",
    "safetensors": "safetensors",
    "pydantic": "pydantic",
}
#: Packages whose major version must match for a reproduction (numerics and the project).
MAJOR_CHECKED = ("torch", "lightning", "sklearn", "numpy", "pandas", "indusflow")


class DataLineage(BaseModel):
    """The training data: where it came from, its content hash, rows per split."""

    model_config = ConfigDict(frozen=True)

    content_hash: str = Field(description="Content hash of the validated table the model was trained on.")
    source: str | None = Field(default=None, description="The input file, or the generator.")
    rows: dict[str, int] = Field(default_factory=dict, description="Rows (or windows) per split.")
    period: dict[str, str] = Field(default_factory=dict, description="Split boundaries, where time-based.")


class Environment(BaseModel):
    """Software and hardware of a run."""

    model_config = ConfigDict(frozen=True)

    packages: dict[str, str | None]
    python: str
    os: str
    cpu: str
    gpu: str | None = None
    torch_threads: int | None = None
    usable_cpus: int | None = None
    thread_env: dict[str, str] = Field(default_factory=dict, description="OMP/MKL thread variables set.")


class Lineage(BaseModel):
    """Everything needed to say what a model version is made of, and to train it again."""

    model_config = ConfigDict(frozen=True)

    flow: str | None = Field(default=None, description="The flow that trained it.")
    flow_run_id: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict, description="The flow's parameters, defaults included.")
    data: DataLineage
    seeds: dict[str, int] = Field(default_factory=dict)
    hardware: dict[str, Any] = Field(default_factory=dict, description="Resolved trainer arguments.")
    precision: str | None = None
    deterministic: bool | None = None
    environment: Environment
    parent: str | None = Field(default=None, description="name:version this one derives from.")
    git_commit: str | None = None
    created_at: str


# ------------------------------------------------------------------------------------
# the machine


def package_versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide a model's numbers (None: absent)."""
    found: dict[str, str | None] = {}
    for dist, shown in PACKAGES.items():
        try:
            found[shown] = md.version(dist)
        except md.PackageNotFoundError:
            found[shown] = None
    return found


def cpu_model() -> str:
    """The CPU model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_model() -> str | None:
    """The first CUDA GPU's name, or None."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"{torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"


def current_environment() -> Environment:
    """Packages, Python, OS, CPU/GPU and threads of this process."""
    import torch

    from infra.hardware import usable_cpus

    return Environment(
        packages=package_versions(),
        python=platform.python_version(),
        os=f"{platform.system()} {platform.release()} ({platform.machine()})",
        cpu=cpu_model(),
        gpu=gpu_model(),
        torch_threads=torch.get_num_threads(),
        usable_cpus=usable_cpus(),
        thread_env=os_threads_env(),
    )


# ------------------------------------------------------------------------------------
# the flow run


def flow_run_parameters() -> tuple[str | None, str | None, dict[str, Any]]:
    """(flow name, flow run id, parameters with defaults filled in) of the current flow
    run, as JSON values; (None, None, {}) outside a flow run."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow is None:
        return None, None, {}
    params = dict(ctx.parameters or {})
    try:
        bound = inspect.signature(ctx.flow.fn).bind_partial(**params)
        bound.apply_defaults()
        params = dict(bound.arguments)
    except TypeError:  # parameters that do not fit the signature: keep them as given
        pass
    run_id = str(ctx.flow_run.id) if ctx.flow_run is not None else None
    return ctx.flow.name, run_id, to_jsonable_python(params, fallback=str)


def collect_lineage(
    *,
    data_hash: str,
    data_source: str | None = None,
    rows: Mapping[str, int] | None = None,
    period: Mapping[str, Any] | None = None,
    seeds: Mapping[str, int] | None = None,
    hardware: TrainerArgs | None = None,
    precision: str | None = None,
    parent: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Lineage:
    """The lineage of a model trained in the current flow run.

    Args:
        data_hash: content hash of the validated training table.
        data_source: its input file (or the generator's name).
        rows: rows (or windows) per split. period: split boundaries.
        seeds: every seed the run used, by what it seeds.
        hardware: the resolved trainer arguments (threads, precision, determinism).
        precision: the precision the trainer actually used (default: the resolved one).
        parent: ``name:version`` this model derives from (an encoder, a fine-tuned parent).
        parameters: the run's configuration (default: the current flow run's parameters).
    """
    flow, run_id, found = flow_run_parameters()
    hw = to_jsonable_python(hardware) if hardware is not None else {}
    return Lineage(
        flow=flow,
        flow_run_id=run_id,
        parameters=to_jsonable_python(dict(parameters), fallback=str) if parameters is not None else found,
        data=DataLineage(content_hash=data_hash, source=data_source, rows=dict(rows or {}),
                         period={k: str(v) for k, v in (period or {}).items()}),
        seeds=dict(seeds or {}),
        hardware=hw,
        precision=precision or (hardware.precision if hardware else None),
        deterministic=hardware.deterministic if hardware is not None else None,
        environment=current_environment(),
        parent=parent,
        git_commit=current_git_commit(),
        created_at=dt.datetime.now(dt.UTC).isoformat(),
    )


def read_lineage(ref: ModelRef) -> Lineage | None:
    """The lineage stored with a version, or None for a version registered without one."""
    path = Path(ref.path) / LINEAGE_FILE
    if not path.exists():
        return None
    return Lineage.model_validate_json(path.read_text())


def lineage_json(lineage: Lineage) -> str:
    """The lineage as the JSON text stored in the version folder."""
    return json.dumps(json.loads(lineage.model_dump_json()), indent=2, sort_keys=True)


# ------------------------------------------------------------------------------------
# comparing environments


def _major(version: str | None) -> str | None:
    return None if version is None else version.split("+")[0].split(".")[0]


def environment_differences(recorded: Environment, current: Environment | None = None
                            ) -> tuple[list[str], list[str]]:
    """(blocking, minor) differences between a recorded environment and this one.

    Blocking: a different major version of a package that decides the numbers
    (:data:`MAJOR_CHECKED`), or a different Python minor version. Minor: any other version
    difference, and a different CPU/GPU model (results then match within tolerance only).
    """
    current = current or current_environment()
    blocking: list[str] = []
    minor: list[str] = []
    for name in sorted(set(recorded.packages) | set(current.packages)):
        old, new = recorded.packages.get(name), current.packages.get(name)
        if old == new:
            continue
        text = f"{name} {old or 'absent'} -> {new or 'absent'}"
        (blocking if name in MAJOR_CHECKED and _major(old) != _major(new) else minor).append(text)
    if recorded.python.rsplit(".", 1)[0] != current.python.rsplit(".", 1)[0]:
        blocking.append(f"python {recorded.python} -> {current.python}")
    elif recorded.python != current.python:
        minor.append(f"python {recorded.python} -> {current.python}")
    for what in ("cpu", "gpu"):
        old, new = getattr(recorded, what), getattr(current, what)
        if old != new:
            minor.append(f"{what} {old} -> {new}")
    return blocking, minor


def render_lineage(lineage: Lineage) -> str:
    """Markdown table of a lineage (for the promotion artifact and the model card)."""
    env = lineage.environment
    pk = ", ".join(f"{k} {v}" for k, v in env.packages.items() if v)
    rows = [
        ("flow run", f"{lineage.flow or '—'} `{lineage.flow_run_id or '—'}`"),
        ("data", f"`{lineage.data.content_hash[:16]}` {lineage.data.source or ''}"),
        ("rows per split", ", ".join(f"{k} {v}" for k, v in lineage.data.rows.items()) or "—"),
        ("period", ", ".join(f"{k} {v}" for k, v in lineage.data.period.items()) or "—"),
        ("seeds", ", ".join(f"{k}={v}" for k, v in lineage.seeds.items()) or "—"),
        ("precision / deterministic", f"{lineage.precision or '—'} / {lineage.deterministic}"),
        ("threads", (f"{lineage.hardware.get('num_threads', '—')} (torch {env.torch_threads}, "
                     f"{env.usable_cpus} usable cores)")),
        ("hardware", f"{env.cpu}" + (f"; GPU {env.gpu}" if env.gpu else "")),
        ("software", f"Python {env.python}, {env.os}; {pk}"),
        ("parent", lineage.parent or "—"),
        ("git commit", (lineage.git_commit or "—")[:12]),
    ]
    return "| lineage | |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows) + "\n"


def os_threads_env() -> dict[str, str]:
    """Thread-count variables set in this process (recorded beside torch's own count)."""
    return {k: v for k, v in os.environ.items() if k in {"OMP_NUM_THREADS", "MKL_NUM_THREADS"}}
