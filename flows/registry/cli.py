"""``python -m flows.registry verify [--model NAME]``, ``approve RUN --reason ...``, ``approvals``: the
registry's commands."""

from __future__ import annotations

from typing import Any

from flows.cli import Command, approval_commands, make_main

VERIFY = "flows.registry.verify:registry_verify"
VERIFY_LOCAL = "tasks.champion:verify_trails"  # reads only: see flows.cli_commands.APPROVALS_LOCAL
CHALLENGER = "flows.registry.challenger:registry_challenger"
ROTATE_KEY = "flows.registry.rotate_key:registry_rotate_key"
KEYGEN = "flows.registry.policy:registry_keygen"
POLICY = "flows.registry.policy:registry_policy"
SIGN = "flows.registry.approve:registry_sign"
#: keygen writes only the key file it is given, sign only reads the registry: without a Prefect API
#: they run as plain functions (no temporary Prefect server: ~8 CPU-s a call)
KEYGEN_LOCAL = "flows.registry.policy:make_signing_key"
SIGN_LOCAL = "flows.registry.approve:sign_decision_for"


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
    """Per model: ok (consistent and anchored), unanchored (consistent with itself only) or FAILED,
    then each problem and what could not be proven."""
    lines = []
    for r in result.reports:
        state = {"ok": "ok", "unanchored": "unanchored", "failed": "FAILED"}[r.status]
        extra = f", {r.unchained} written before the chain" if r.unchained else ""
        head = f", head {r.head_sha256[:16]}…" if r.head_sha256 else ""
        pinned = f", {r.anchored} pinned by {', '.join(r.anchors)}" if r.anchors else ""
        lines.append(f"{r.name}: {state} ({r.entries} entries, {r.files_checked} files re-hashed{pinned}{extra}{head})")
        lines += [f"  line {p.line}: {p.problem}" if p.line else f"  {p.problem}" for p in r.problems]
        lines += [f"  not proven: {u}" for u in r.unproven]
    return "\n".join(lines) or "no registered model"


def keygen_summary(result: Any) -> str:
    return (f"private key of {result.person} written to {result.path} (keep it in your own account)\n"
            f"enrol this public key: {result.person}:{result.public_key}")


def policy_summary(result: Any) -> str:
    if not result.in_force:
        return f"{result.model}: policy {result.seq} signed by {result.signed_by}, not in force yet: {result.waiting_for}"
    need = "need" if result.approval_required else "do not need"
    return (f"{result.model}: policy {result.seq} signed by {result.signed_by}; alias moves {need} approval by "
            f"one of {', '.join(result.approvers)}")


def sign_summary(result: Any) -> str:
    return result.model_dump_json()


COMMANDS = (
    Command("verify", VERIFY, verify_summary, help="check the hash-chained registry trail; exit 1 if it was altered",
            check=check_verify, exit_code=lambda result: 0 if result.ok else 1, local=VERIFY_LOCAL),
    Command("challenger", CHALLENGER, challenger_summary, positional="model",
            help="point the challenger alias at NAME:VERSION (serving scores it in shadow or split), or --clear it"),
    Command("rotate-key", ROTATE_KEY, lambda r: f"rewrapped {r.rewrapped} data keys under {r.new_key} "
            f"({r.already_current} already were; models: {', '.join(r.models) or 'none'})",
            help="rewrap the encrypted registry's data keys under the key INDUSFLOW_REGISTRY_KEY names now",
            check=check_rotate_key),
    *approval_commands(),
    Command("sign", SIGN, sign_summary, positional="run", local=SIGN_LOCAL,
            help="sign a decision on a waiting run with your key and print it (for the Prefect form or the API)"),
    Command("keygen", KEYGEN, keygen_summary, positional="person", local=KEYGEN_LOCAL,
            help="make your approver signing key (ed25519) and print the public key to enrol"),
    Command("policy", POLICY, policy_summary,
            help="set who may approve a model's alias moves (signed by an approver; on the trail)"),
)

main = make_main(
    "python -m flows.registry",
    "The model registry: verify its tamper-evident trail of alias moves; name the challenger that serving "
    "scores beside the champion; approve or reject a champion move "
    "that waits for a second person (four eyes). Each command accepts --json and then "
    "prints the flow's typed result as one JSON object on the last line of stdout.",
    COMMANDS,
)
