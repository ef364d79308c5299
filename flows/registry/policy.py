"""``registry-keygen`` and ``registry-policy``: an approver's signing key, and a model's approval
policy (who may approve its alias moves), signed by an approver."""

from __future__ import annotations

from pathlib import Path

from prefect import flow
from pydantic import BaseModel, ConfigDict

from tasks.champion import PolicyChange, set_policy_task


class SigningKey(BaseModel):
    """``registry-keygen``: where the private key is, and the public key to enrol."""

    model_config = ConfigDict(frozen=True)

    person: str
    path: str
    public_key: str


def make_signing_key(person: str, out: str) -> SigningKey:
    """The key pair ``registry-keygen`` makes (its private key written to ``out``): what the command
    calls without a Prefect API, since it touches no registry file."""
    from infra.registry_policy import generate_signing_key

    path = Path(out).expanduser()
    return SigningKey(person=person, path=str(path), public_key=generate_signing_key(path))


@flow(name="registry-keygen", log_prints=True)
def registry_keygen(person: str, out: str) -> SigningKey:
    """Make an approver's ed25519 signing key: the private key is written to --out (mode 0600, in
    your own account, never under the shared home); the public key printed is what a model's
    policy enrols for you.

    Args:
        person: your name as the policy will list it.
        out: where to write the private key (an existing file is never overwritten).
    """
    return make_signing_key(person, out)


@flow(name="registry-policy", log_prints=True)
def registry_policy(model: str, approvers: list[str], key: str, approval_required: bool = True,
                    emergency_rollback: bool = True) -> PolicyChange:
    """Set a model's approval policy: who may approve its champion and challenger moves. The
    registry then refuses every alias move of the model without a decision signed by one of them
    who did not start it. The policy is signed with --key: the first policy by one of the approvers
    it enrols; a change by two people of the policy it replaces when it enrols two or more (each runs
    this command with the same arguments and their own --key; the first signature is kept as a
    proposal until the second arrives). Proposals and changes are on the trail.

    Args:
        model: the model NAME.
        approvers: each PERSON:PUBLIC_KEY[:ACCOUNT,ACCOUNT] (the accounts are the OS or Prefect
            users that are this person, so a run they start cannot be approved by them).
        key: path of the signing approver's ed25519 private key.
        approval_required: false: alias moves need no approval (the change still needs a signature).
        emergency_rollback: a rollback to the champion before may move at once (recorded as an emergency).
    """
    return set_policy_task(model, approvers, Path(key).expanduser(), approval_required=approval_required,
                           emergency_rollback=emergency_rollback)
