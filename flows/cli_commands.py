"""The commands every vertical shares (``promote`` / ``rollback``, ``approve`` / ``approvals``,
``evidence``) with their pre-flight checks, and two helpers of the verticals' command modules:
:func:`given` (a parameter's value before the flow runs) and :func:`lazy_exports` (a flows package
that imports its flows on first use). Imported through :mod:`flows.cli`."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable, Mapping
from typing import Any

from flows.cli_params import Command
from flows.cli_source import flow_function


def given(kwargs: Mapping[str, Any], flow: str | Any, name: str) -> Any:
    """The value a parameter will have: given on the command line, or the flow's default."""
    if name in kwargs:
        return kwargs[name]
    default = inspect.signature(flow_function(flow)).parameters[name].default
    return None if default is inspect.Parameter.empty else default


def lazy_exports(module: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``__getattr__`` and ``__dir__`` of a flows package whose ``exports`` (name ->
    the module defining it) are imported on first use, so that importing a light module of the
    package (its ``cli``) does not import every flow, torch and Lightning."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(sys.modules[module], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[module])) | set(exports))

    return __getattr__, __dir__


def champion_commands(promote: str, rollback: str) -> tuple[Command, Command]:
    """A vertical's ``promote`` and ``rollback`` commands over its two flows (entrypoints), with
    their pre-flight checks: the version to promote, or the model to roll back, is registered."""

    def check_promote(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry
        from tasks.champion import version_spec

        try:
            name, version = version_spec(kwargs["model"])
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        ModelRegistry().get(name, version)  # RegistryError names the models / versions

    def check_rollback(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry
        from tasks.champion import bare_name

        try:
            name = bare_name(given(kwargs, rollback, "model"))
        except ValueError as exc:
            raise ValueError(f"--model: {exc}") from None
        ModelRegistry().get(name)  # RegistryError: unknown model, or no champion yet

    def summary(decision: Any) -> str:
        from tasks.champion import champion_move_summary

        return champion_move_summary(decision)

    return (
        Command("promote", promote, summary, help="make a registered version the champion by hand (NAME:VERSION)",
                check=check_promote),
        Command("rollback", rollback, summary, help="return the champion to the version that was champion before",
                check=check_rollback),
    )


APPROVE = "flows.registry.approve:registry_approve"
APPROVALS = "flows.registry.approve:registry_approvals"
#: ``approvals`` and ``verify`` only read the registry's files: without a Prefect API they call the
#: flow's function directly (no flow run to record, so no temporary Prefect server: ~8 CPU-s and
#: ~10 s per call on 2 cores, 2026-12-07)
APPROVALS_LOCAL = "flows.registry.approve:list_approvals"


def approval_commands() -> tuple[Command, Command]:
    """The ``approve RUN --reason ...`` and ``approvals`` commands (four eyes on champion moves),
    the same in each vertical and in ``flows.registry``."""

    def run_api(kwargs: dict[str, Any]) -> str | None:
        from tasks.approval import find_request

        return find_request(kwargs["run"]).api_url  # ApprovalError names the waiting runs

    def approve_summary(request: Any) -> str:
        outcome = {"waiting": "sent; the run has not recorded it yet (it resumes at its next check)"}.get(
            request.status, f"{request.status} by {request.decided_by}")
        return f"{request.model} v{request.candidate_version} (run {request.run_id}): {outcome}"

    def approvals_summary(result: Any) -> str:
        return "\n".join(
            f"{r.run_id}  {r.model} v{r.candidate_version}  {r.status}  asked by {r.requested_by} at "
            f"{r.requested_at[:19]}" + (f", until {r.expires_at[:19]}" if r.status == "waiting" else
                                        f", {r.decided_by or 'nobody'}: {r.decision_reason}")
            for r in result.requests) or "no approval requests"

    return (
        Command("approve", APPROVE, approve_summary, positional="run", api_url=run_api,
                help="approve (or --reject) the champion move a paused run waits for; four eyes"),
        Command("approvals", APPROVALS, approvals_summary, local=APPROVALS_LOCAL,
                help="list the champion moves waiting for approval"),
    )


def evidence_command(entrypoint: str, help: str) -> Command:
    """A vertical's ``evidence`` command (its flow returns ``tasks.online_evidence.OnlineEvidence``),
    with its pre-flight check: ``--model`` is a registered bare NAME."""

    def check(kwargs: dict[str, Any]) -> None:
        from infra.registry import ModelRegistry, parse_model_spec

        name = given(kwargs, entrypoint, "model")
        if parse_model_spec(name)[0] != name:
            raise ValueError(f"--model {name!r}: evidence takes a model NAME (its champion and challenger are "
                             "compared)")
        known = ModelRegistry().models()
        if name not in known:
            raise ValueError(f"--model: no registered model {name!r}; registered: {', '.join(known) or 'none'}")

    def summary(result: Any) -> str:
        from tasks.online_evidence import CLASSIFICATION

        classify = result.rule.metric in CLASSIFICATION
        lines = []
        for v in result.versions:
            m = (f"{result.rule.metric} {v.metric.value:.4f} [{v.metric.low:.4f}, {v.metric.high:.4f}]" if v.metric
                 else f"{result.rule.metric} n/a")
            count = f"{v.positives} positive" if classify else f"{v.subjects or 0} {result.subjects_are}"
            lines.append(f"v{v.version} ({', '.join(v.roles)}): scored {v.scored}, labelled {v.labelled} "
                         f"({count}), {m}")
        lines.append(f"{result.recommendation}: {result.reason}")
        if result.promotion is not None:
            lines.append(f"promotion: {result.promotion.reason}")
        return "\n".join(lines)

    return Command("evidence", entrypoint, summary, help=help, check=check)
