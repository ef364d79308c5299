"""Test helpers for the model-risk controls: enrolled approvers with their own signing keys, and
signed decisions for a waiting run (what ``python -m flows.registry keygen / policy / sign`` do)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from infra.registry import ModelRegistry, current_actor
from infra.registry_policy import (
    Approver,
    DecisionStatement,
    ModelPolicy,
    SignedDecision,
    generate_signing_key,
    load_signing_key,
    now_iso,
    sha256_of,
    sign_decision,
    sign_policy,
)


@dataclass(frozen=True)
class Person:
    name: str
    key_path: Path
    public_key: str

    def key(self):
        return load_signing_key(self.key_path)


def person(folder: Path, name: str) -> Person:
    """A person with their own ed25519 key under ``folder`` (their account, not the home)."""
    path = folder / f"{name}.pem"
    return Person(name, path, generate_signing_key(path))


def enrol(registry: ModelRegistry, model: str, folder: Path, *, initiator: str = "alice",
          others: tuple[str, ...] = ("bob",), signer: str | None = None) -> dict[str, Person]:
    """A policy of ``model`` enrolling ``initiator`` (whose account is this process's OS account: the
    runs this test starts are theirs) and ``others``; signed by ``signer`` (default: the initiator)."""
    people = {n: person(folder, n) for n in (initiator, *others)}
    current = registry.policy(model)
    policy = ModelPolicy(model=model, seq=current.seq + 1 if current else 1,
                         previous_sha256=sha256_of(current) if current else None,
                         approvers=[Approver(person=p.name, public_key=p.public_key,
                                             accounts=[current_actor()] if p.name == initiator else [])
                                    for p in people.values()])
    registry.set_policy(model, sign_policy(people[signer or initiator].key(), policy))
    return people


def statement_for(registry: ModelRegistry, model: str, version: int, who: Person, *, alias: str = "champion",
                  run_id: str | None = None, decision: str = "approve", reason: str = "reviewed") -> SignedDecision:
    """``who``'s signed decision on pointing ``alias`` of ``model`` at ``version``."""
    statement = DecisionStatement(model=model, version=version, alias=alias,
                                  files=registry.version_files(model, version), run_id=run_id, decision=decision,
                                  reason=reason, signer=who.name, at=now_iso())
    return sign_decision(who.key(), statement)
