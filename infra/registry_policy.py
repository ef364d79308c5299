"""Who may approve which model's alias moves, and the signed decisions that say they did.

A model's **policy** (``registry/<name>/policy.json``) lists its approvers: each a person, the
ed25519 public key they hold (the private key stays in their own account: ``keygen``), and the
accounts (OS or Prefect user names) that are that person. While a policy requires approval, every
champion and challenger move of the model needs a **signed decision**: a statement over (model,
version, alias, the version's file hashes, run, decision, reason, time) signed by an enrolled
approver who is not the move's initiator. The registry checks it on every move
(:meth:`infra.registry.ModelRegistry.set_alias`, ``promote``, ``rollback``), whatever process asks,
so a name typed in a form, a run input or an environment variable never makes an approval.

A policy is itself signed: the first by one of the approvers it enrols, each later one by an
approver of the policy it replaces; every policy is an entry of the model's trail (its hash), so
a policy file replaced or deleted outside the registry is refused on the next move and named by
``verify``. The threat model: ``docs/model-risk.md``.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.errors import ApprovalError

POLICY_FILE = "policy.json"
#: A policy change signed by fewer approvers than it needs, waiting for the others' signatures.
POLICY_PROPOSAL_FILE = "policy.proposed.json"
#: How a decision or a policy is signed (the only algorithm accepted).
ALGORITHM: Final = "ed25519"


def canonical(obj: BaseModel) -> bytes:
    """The bytes a signature covers: the model as sorted, compact JSON."""
    return json.dumps(obj.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


def sha256_of(obj: BaseModel) -> str:
    return hashlib.sha256(canonical(obj)).hexdigest()


def same_person(a: str, b: str) -> bool:
    """Whether two names are the same person (case and spacing ignored)."""
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


# ------------------------------------------------------------------------------------
# keys


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def generate_signing_key(path: Path) -> str:
    """Write a new ed25519 private key (PKCS#8 PEM, mode 0600) to ``path``; returns its public key
    (base64 of the 32 raw bytes: what the policy enrols). Refuses to overwrite a key."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return public_key_of(key)


def load_signing_key(path: Path) -> Any:
    """The ed25519 private key in ``path`` (ApprovalError naming the file otherwise)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ApprovalError(f"{path}: not a readable ed25519 private key ({type(exc).__name__}); make one with "
                            "`python -m flows.registry keygen PERSON --out PATH`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ApprovalError(f"{path}: the key is not ed25519")
    return key


def public_key_of(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return _b64(key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))


def sign_bytes(key: Any, data: bytes) -> str:
    return _b64(key.sign(data))


def signature_valid(public_key: str, data: bytes, signature: str) -> bool:
    """Whether ``signature`` (base64) is ``public_key``'s (base64 raw ed25519) over ``data``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key, validate=True)).verify(
            base64.b64decode(signature, validate=True), data)
    except (InvalidSignature, ValueError):
        return False
    return True


# ------------------------------------------------------------------------------------
# the policy


class Approver(BaseModel):
    """One enrolled approver."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    person: str = Field(min_length=1, max_length=100)
    public_key: str = Field(min_length=40, max_length=60, description="ed25519 public key, base64 of 32 bytes.")
    accounts: list[str] = Field(default_factory=list, description="OS or Prefect user names that are this person "
                                "(a run one of them started cannot be approved by them).")

    def names(self) -> list[str]:
        return [self.person, *self.accounts]


class ModelPolicy(BaseModel):
    """A model's approval policy, as signed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    seq: int = Field(ge=1, description="1 for the first policy, then one more per change.")
    previous_sha256: str | None = Field(description="Hash of the policy this one replaces (None: the first).")
    approval_required: bool = True
    approvers: list[Approver]
    emergency_rollback: bool = Field(default=True, description="A rollback to the champion before may move at "
                                     "once (an emergency), recorded as such.")
    max_decision_age_s: int = Field(default=86_400, ge=60, description="A signed decision older than this is refused.")

    def approver(self, public_key: str) -> Approver | None:
        return next((a for a in self.approvers if a.public_key == public_key), None)


class PolicySignature(BaseModel):
    """One approver's signature over a policy."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    public_key: str
    signature: str


class SignedPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: ModelPolicy
    public_key: str = Field(description="The signer's public key (an approver of the policy it replaces).")
    signature: str
    algorithm: Literal["ed25519"] = ALGORITHM
    cosignatures: list[PolicySignature] = Field(
        default_factory=list, description="Other approvers' signatures over the same policy (a change of a policy "
        "that enrols two people or more needs two: :func:`signatures_needed`).")

    @property
    def sha256(self) -> str:
        return sha256_of(self.policy)

    def signatures(self) -> list[PolicySignature]:
        return [PolicySignature(public_key=self.public_key, signature=self.signature), *self.cosignatures]

    def with_signatures(self, extra: list[PolicySignature]) -> SignedPolicy:
        """This policy with the signatures of ``extra`` by keys that have not signed it yet (valid ones only)."""
        have = {s.public_key for s in self.signatures()}
        new = [s for s in extra if s.public_key not in have and signature_valid(s.public_key, canonical(self.policy),
                                                                                 s.signature)]
        return self.model_copy(update={"cosignatures": [*self.cosignatures, *new]})


def sign_policy(key: Any, policy: ModelPolicy) -> SignedPolicy:
    return SignedPolicy(policy=policy, public_key=public_key_of(key), signature=sign_bytes(key, canonical(policy)))


def signatures_needed(current: ModelPolicy | None) -> int:
    """People of ``current`` who must sign its replacement: two where it enrols two people or more (no
    approver alone widens their own rights: enrols a second key they hold, removes their accounts,
    turns approval off), else one (a first policy, or a policy of one approver)."""
    if current is None:
        return 1
    return 2 if len({" ".join(a.person.split()).casefold() for a in current.approvers}) >= 2 else 1


def check_policy_change(new: SignedPolicy, current: ModelPolicy | None) -> list[Approver]:
    """The approvers who signed ``new``, once every signature and the chain to ``current`` hold and
    enough different people of ``current`` signed (ApprovalError ``cosign`` when one more is needed)."""
    policy = new.policy
    signer_in = current if current is not None else policy
    whose = "the current policy" if current is not None else "the policy it enrols (a first policy)"
    signers: list[Approver] = []
    for sig in new.signatures():
        signer = signer_in.approver(sig.public_key)
        if signer is None:
            raise ApprovalError(f"policy of {policy.model}: signed by a key that is no approver of {whose}",
                                code="not_approver")
        if not signature_valid(sig.public_key, canonical(policy), sig.signature):
            raise ApprovalError(f"policy of {policy.model}: the signature does not verify", code="signature")
        if not any(same_person(signer.person, s.person) for s in signers):
            signers.append(signer)
    want_seq, want_prev = (1, None) if current is None else (current.seq + 1, sha256_of(current))
    if (policy.seq, policy.previous_sha256) != (want_seq, want_prev):
        raise ApprovalError(f"policy of {policy.model}: seq {policy.seq} / previous {policy.previous_sha256} does "
                            f"not follow the current policy (expected seq {want_seq}, previous {want_prev})",
                            code="stale")
    if not policy.approvers:
        raise ApprovalError(f"policy of {policy.model}: enrols no approver")
    need = signatures_needed(current)
    if len(signers) < need:
        others = [a.person for a in signer_in.approvers if not any(same_person(a.person, s.person) for s in signers)]
        raise ApprovalError(f"policy of {policy.model}: signed by {', '.join(s.person for s in signers)}; a change "
                            f"needs {need} different approvers of the current policy: one of {', '.join(others)} "
                            "must sign the same policy too", code="cosign")
    return signers


# ------------------------------------------------------------------------------------
# signed decisions


class DecisionStatement(BaseModel):
    """What an approver signs: this version, these files, this alias, this run, this decision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str
    version: int
    alias: str = Field(description="The alias the decision moves (champion, challenger).")
    files: dict[str, str] = Field(description="SHA-256 of each file of the version, as the trail recorded them.")
    run_id: str | None = Field(description="The paused run the decision answers (None: a move outside a run).")
    decision: Literal["approve", "reject"]
    reason: str = Field(min_length=3, max_length=2000)
    signer: str = Field(description="The approver's person name (checked against the policy).")
    at: str = Field(description="When it was signed (UTC, ISO 8601).")


class SignedDecision(BaseModel):
    """A decision statement and the approver's ed25519 signature over it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    statement: DecisionStatement
    public_key: str
    signature: str
    algorithm: Literal["ed25519"] = ALGORITHM

    @property
    def sha256(self) -> str:
        return sha256_of(self.statement)


def sign_decision(key: Any, statement: DecisionStatement) -> SignedDecision:
    return SignedDecision(statement=statement, public_key=public_key_of(key),
                          signature=sign_bytes(key, canonical(statement)))


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def decision_signer(policy: ModelPolicy, signed: SignedDecision, model: str) -> Approver:
    """The enrolled approver whose key signed ``signed`` (ApprovalError ``not_approver`` / ``signature``):
    what a move checks, and what ``verify`` checks again of every signed entry on the trail."""
    approver = policy.approver(signed.public_key)
    if approver is None:
        raise ApprovalError(f"{model}: the decision is signed by a key no approver of its policy holds "
                            "(enrol it: python -m flows.registry policy)", code="not_approver")
    if not signature_valid(signed.public_key, canonical(signed.statement), signed.signature):
        raise ApprovalError(f"{model}: the decision's signature does not verify (edited after signing?)",
                            code="signature")
    if not same_person(signed.statement.signer, approver.person):
        raise ApprovalError(f"{model}: the statement names {signed.statement.signer!r} but the key is "
                            f"{approver.person!r}'s", code="signature")
    return approver


def check_decision(policy: ModelPolicy, signed: SignedDecision, *, model: str, version: int, alias: str,
                   files: dict[str, str], initiators: list[str], run_id: str | None = None) -> Approver:
    """The enrolled approver who signed ``signed``, once it holds for this move: a valid signature by
    an enrolled key, over this model, version, alias, files (and run, when one waits), recent, and
    the signer is none of ``initiators``. ApprovalError says which check failed (``code``)."""
    s = signed.statement
    approver = decision_signer(policy, signed, model)
    wanted = {"model": model, "version": version, "alias": alias, "files": files}
    got = {"model": s.model, "version": s.version, "alias": s.alias, "files": s.files}
    if run_id is not None:
        wanted["run_id"], got["run_id"] = run_id, s.run_id
    if wanted != got:
        differ = ", ".join(k for k in wanted if wanted[k] != got[k])
        raise ApprovalError(f"{model}: the signed decision is about another move (differs in: {differ})",
                            code="stale")
    age = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(s.at)).total_seconds()
    if not -300 <= age <= policy.max_decision_age_s:
        raise ApprovalError(f"{model}: the decision was signed {age:.0f} s ago; the policy accepts "
                            f"{policy.max_decision_age_s} s at most", code="stale")
    for who in initiators:
        if any(same_person(who, name) for name in approver.names()):
            raise ApprovalError(f"four eyes: {who} started this move, so {approver.person} may not decide it",
                                code="four_eyes")
    return approver


def read_policy(folder: Path) -> SignedPolicy | None:
    path = folder / POLICY_FILE
    return SignedPolicy.model_validate_json(path.read_text()) if path.exists() else None
