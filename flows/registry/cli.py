"""``python -m flows.registry verify [--model NAME]``, ``approve RUN --reason ...``, ``approvals``: the
registry's commands."""

from __future__ import annotations

from typing import Any

from flows.cli import Command, approval_commands, make_main

VERIFY = "flows.registry.verify:registry_verify"
CHALLENGER = "flows.registry.challenger:registry_challenger"
ROTATE_KEY = "flows.registry.rotate_key:registry_rotate_key"


def check_verify(kwargs: dict[str, Any]) -> None:
    """``--model`` names a registered model."""
    from infra.registry import ModelRegistry

    model = kwargs.get("model")
    if model:
        known = ModelRegistry().models()
        if model not in known:
            raise ValueError(f"--model: no registered model {model!r}; registered: {', '.join(known) or 'none'}")


def check_rotate_key(kwargs: dict[str, Any]) -> None:
    """Both keys can be read and differ (before any Prefect start)."""
    from infra.sealed import rotation_keys

    rotation_keys(kwargs["old_key"])


def challenger_summary(move: Any) -> str:
    from tasks.champion import challenger_summary as summary

    return summary(move)


def verify_summary(result: Any) -> str:
    lines = []
    for r in result.reports:
        state = "ok" if r.ok else "FAILED"
        extra = f", {r.unchained} written before the chain" if r.unchained else ""
        head = f", head {r.head_sha256[:16]}…" if r.head_sha256 else ""
        lines.append(f"{r.name}: {state} ({r.entries} entries{extra}{head})")
        lines += [f"  line {p.line}: {p.problem}" if p.line else f"  {p.problem}" for p in r.problems]
    return "\n".join(lines) or "no registered model"


COMMANDS = (
    Command("verify", VERIFY, verify_summary, help="check the hash-chained registry trail; exit 1 if it was altered",
            check=check_verify, exit_code=lambda result: 0 if result.ok else 1),
    Command("challenger", CHALLENGER, challenger_summary, positional="model",
            help="point the challenger alias at NAME:VERSION (serving scores it in shadow or split), or --clear it"),
    Command("rotate-key", ROTATE_KEY, lambda r: f"rewrapped {r.rewrapped} data keys under {r.new_key} "
            f"({r.already_current} already were; models: {', '.join(r.models) or 'none'})",
            help="rewrap the encrypted registry's data keys under the key INDUSFLOW_REGISTRY_KEY names now",
            check=check_rotate_key),
    *approval_commands(),
)

main = make_main(
    "python -m flows.registry",
    "The model registry: verify its tamper-evident trail of alias moves; name the challenger that serving "
    "scores beside the champion; approve or reject a champion move "
    "that waits for a second person (four eyes). Each command accepts --json and then "
    "prints the flow's typed result as one JSON object on the last line of stdout.",
    COMMANDS,
)
