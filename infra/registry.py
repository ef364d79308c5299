"""A small file-based model registry under the home folder.

Layout::

    registry/<name>/<version>/weights.safetensors   tensors only (no pickle)
    registry/<name>/<version>/meta.json             params, metrics, lineage
    registry/<name>/aliases.json                    {"champion": 3, ...}
    registry/<name>/alias_history.jsonl             the trail: one line per alias move, hash-chained
    registry/<name>/alias_history.head.json         the trail's length and last line's hash

A version folder appears in one atomic rename, so a failed registration leaves nothing
half-written. The ``champion`` alias moves only through :meth:`ModelRegistry.promote`,
which applies the champion rule (beat the current champion on the primary metric) or, with
``force``, moves it by hand; :meth:`ModelRegistry.rollback` returns it to the champion before.
Every move is appended to the alias history; a home written before the history existed
keeps working (its first rollback has no earlier champion to return to).

The history is a tamper-evident trail: each entry records who moved the alias (``by``: the OS
account of the process, as the OS reports it, never an environment variable; and for an approved
move the approver's signed decision), when, why, from which version to which, and its evidence
(SHA-256 of the version's ``meta.json`` and ``card.json``, and of the champion comparison the
decision read), and carries ``prev``: the SHA-256 of the line before it. A version's registration
is an entry too (``register``: the SHA-256 of every file of the folder as stored), and so is each
document written into it later (``document``: the card). The head file holds the number of
lines and the last line's hash; every entry's hash is also sent to the configured anchors outside
the registry folder (:mod:`infra.registry_anchor`). :meth:`ModelRegistry.verify_trail` recomputes
the chain, re-hashes every version's files, compares ``aliases.json`` with the trail's last moves
and the head with the anchors; without an anchor it says the trail is only "unanchored".

The registry enforces each model's policy (:mod:`infra.registry_policy`) on every alias move,
whatever process asks: a model whose policy requires approval moves an alias only with a decision
signed by an enrolled approver who did not start the move.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import json
import logging
import math
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infra import sealed
from infra.errors import ApprovalError, QualityGateError, RegistryError
from infra.home import home_layout
from infra.registry_anchor import publish_head, version_file_hashes
from infra.registry_policy import (
    POLICY_FILE,
    POLICY_PROPOSAL_FILE,
    ModelPolicy,
    SignedDecision,
    SignedPolicy,
    check_decision,
    check_policy_change,
    read_policy,
    sha256_of,
)
from infra.registry_trail import (
    ALIAS_HISTORY_FILE,
    DOCUMENT,
    POLICY,
    POLICY_PROPOSED,
    REGISTER,
    TRAIL_HEAD_FILE,
    TrailReport,
    check_trail,
    recorded_files,
    sha256_text,
)
from infra.store import check_name, safe_join, sha256_file, write_json_atomic

log = logging.getLogger(__name__)

WEIGHTS_FILE = "weights.safetensors"
META_FILE = "meta.json"
CARD_FILE = "card.json"
CHAMPION = "champion"
#: The alias a serving process scores beside the champion (shadow or split; flows.serve).
CHALLENGER = "challenger"
#: Trail entries that move no alias: the approval of a champion move (tasks.approval).
TRAIL_EVENTS = ("approval-requested", "approved", "rejected", "approval-refused", "approval-expired")
#: ``ModelRef.kind`` values: what a version's files load into (compressed variants: tasks.compress).
KIND_TORCH = "torch"
KIND_SKLEARN = "sklearn-skops"  # a scikit-learn model in a skops file (infra.sklearn_store), no tensors
KIND_TORCH_SKLEARN = "torch+sklearn-skops"  # an ensemble: the tensors and a skops file
SKLEARN_FILE = "model.skops"


class ModelRef(BaseModel):
    """A registered model version: what it is, where it lives, how good it was."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: int
    path: str = Field(description="Folder of this version.")
    kind: str = Field(default="torch", description="What the weights load into.")
    params: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, float] = Field(default_factory=dict)
    primary_metric: str
    higher_is_better: bool = True
    data_hash: str | None = None
    git_commit: str | None = None
    created_at: str
    parent: str | None = Field(default=None, description="name:version this one derives from.")
    tags: dict[str, str] = Field(default_factory=dict)

    @property
    def spec(self) -> str:
        """``name:version``."""
        return f"{self.name}:{self.version}"

    @property
    def weights_path(self) -> Path:
        return Path(self.path) / WEIGHTS_FILE

    def file(self, file_name: str) -> Path:
        """A file stored with this version (``extra_files`` of the registration)."""
        return safe_join(Path(self.path), check_name(file_name, "file name"))

    def primary_value(self) -> float | None:
        return self.metrics.get(self.primary_metric)


class Approval(BaseModel):
    """A second person's decision on an alias move (four eyes), as the trail records it."""

    model_config = ConfigDict(frozen=True)

    run_id: str | None = Field(description="The Prefect flow run that waited for the decision (None: none waited).")
    requested_by: str = Field(description="Who started the run (the Prefect user, else the process's OS account).")
    decided_by: str | None = Field(default=None, description="The enrolled approver whose key signed the decision "
                                   "(None: nobody, it expired).")
    approved: bool
    reason: str
    requested_at: str
    decided_at: str
    signed: SignedDecision | None = Field(default=None, description="The signed decision (checked by the registry "
                                          "against the model's policy on the move).")
    via: str | None = Field(default=None, description="The channel that carried it (an API key id, the CLI, the "
                            "Prefect form).")


class PromotionDecision(BaseModel):
    """Why the champion alias moved, or did not."""

    model_config = ConfigDict(frozen=True)

    name: str
    metric: str
    candidate_version: int
    candidate_value: float | None
    champion_version: int | None
    champion_value: float | None
    promoted: bool
    reason: str
    p_value: float | None = Field(
        default=None, description="Paired-bootstrap p-value of 'the candidate beats the champion', when measured.")
    alpha: float | None = Field(default=None, description="Significance level the rule required (None: off).")
    rescored_in_lock: bool = Field(
        default=False, description="The champion changed after the caller compared: re-compared inside the lock.")
    trail_sha256: str | None = Field(
        default=None, description="The registry trail's head after the decision (SHA-256 of its last line): "
        "kept outside the registry, it pins the trail (ModelRegistry.verify_trail).")
    approval: Approval | None = Field(
        default=None, description="The approval this move needed and got, or the rejection that stopped it.")
    awaiting_approval: bool = Field(
        default=False, description="The champion rule would promote, but the model needs approval first "
        "(a decision made with decide_only; nothing moved).")


#: Two metric values this close (relative) are a tie: the same model scored along two paths differs
#: only in float rounding (0.1 + 0.2 vs 0.3), and a tie never replaces the champion.
TIE_REL_TOL = 1e-9


def beats(value: float, champion_value: float, *, higher_is_better: bool, min_delta: float = 0.0) -> bool:
    """Whether ``value`` improves on ``champion_value`` by more than ``min_delta``; a tie (equal up
    to :data:`TIE_REL_TOL`) never does, whatever ``min_delta``."""
    if math.isclose(value, champion_value, rel_tol=TIE_REL_TOL, abs_tol=1e-12):
        return False
    return (value - champion_value if higher_is_better else champion_value - value) > min_delta


def current_actor() -> str:
    """Who the trail names for a move made by this process: its OS account, as the OS reports it
    (``getpass`` would trust ``USER``/``LOGNAME``: an environment variable never names anyone)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # no passwd entry (a container's numeric user)
        return f"uid:{os.getuid()}"


class ChampionComparison(BaseModel):
    """The candidate compared with one champion version on the candidate's evaluation data.

    Promotion is compare-and-swap: a comparison counts only while ``champion_version`` is
    still the champion inside the registry lock.
    """

    model_config = ConfigDict(frozen=True)

    champion_version: int = Field(description="The champion version that was scored.")
    champion_value: float | None = Field(description="Its primary metric on the candidate's data (None: unknown).")
    p_value: float | None = Field(default=None, description="Paired-bootstrap p-value of 'candidate is better'.")


def parse_model_spec(spec: str) -> tuple[str, str]:
    """Split ``name[:version|alias]`` or ``name@alias`` into (name, version-or-alias);
    default ``champion``."""
    name, sep, version = spec.partition(":")
    if not sep and "@" in spec:
        name, _, version = spec.partition("@")
    check_name(name, "model name")
    return name, version or CHAMPION


def current_git_commit() -> str | None:
    """The git commit of the working tree, or None outside a repository."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None


class ModelRegistry:
    """File-based registry; safe for several processes on one machine (flock)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else home_layout().registry()

    # -- paths and locking -------------------------------------------------------------
    def _model_dir(self, name: str) -> Path:
        return safe_join(self.root, check_name(name, "model name"))

    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        model_dir = self._model_dir(name)
        model_dir.mkdir(parents=True, exist_ok=True)
        with open(model_dir / ".lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _aliases(self, name: str) -> dict[str, int]:
        path = self._model_dir(name) / "aliases.json"
        if not path.exists():
            return {}
        return {k: int(v) for k, v in json.loads(path.read_text()).items()}

    def _evidence(self, name: str, version: int, comparison: Mapping[str, Any] | None) -> dict[str, str]:
        """SHA-256 of the version's meta and card and of the comparison a decision read."""
        folder = self._model_dir(name) / str(int(version))
        out = {}
        for key, file_name in (("meta_sha256", META_FILE), ("card_sha256", CARD_FILE)):
            path = folder / file_name
            if path.is_file():
                out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        if comparison is not None:
            out["comparison_sha256"] = sha256_text(json.dumps(comparison, sort_keys=True, default=str))
        return out

    def _trail_lines(self, name: str) -> list[str]:
        path = self._model_dir(name) / ALIAS_HISTORY_FILE
        return [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    def _append_trail(self, name: str, entry: dict[str, Any]) -> str:
        """Append ``entry`` to the trail, numbered and chained to the line before (inside the lock);
        returns the new head (the line's hash)."""
        lines = self._trail_lines(name)
        entry = {**entry, "seq": len(lines) + 1, "at": dt.datetime.now(dt.UTC).isoformat(),
                 "prev": sha256_text(lines[-1]) if lines else None}
        entry.setdefault("by", current_actor())
        line = json.dumps(entry, sort_keys=True)
        with open(self._model_dir(name) / ALIAS_HISTORY_FILE, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        head = sha256_text(line)
        write_json_atomic(self._model_dir(name) / TRAIL_HEAD_FILE, {"entries": len(lines) + 1, "last_sha256": head})
        publish_head(name, len(lines) + 1, head)
        return head

    # -- files and policy on the trail -------------------------------------------------
    def _recorded_files(self, name: str) -> dict[int, dict[str, str]]:
        """Version -> file -> SHA-256, as the trail's ``register`` and ``document`` entries recorded them."""
        return recorded_files(self.trail(name))

    def version_files(self, name: str, version: int) -> dict[str, str]:
        """The SHA-256 of each file of a version as the trail recorded them (what an approver signs);
        RegistryError when the files on disk differ or the version was never registered on the trail."""
        recorded = self._recorded_files(name).get(int(version))
        if recorded is None:
            raise RegistryError(f"{name}:{version} has no registration entry in its trail (registered before files "
                                "were hashed, or written outside the registry): it cannot be approved")
        stored = version_file_hashes(self._model_dir(name) / str(int(version)))
        if stored != recorded:
            differ = sorted(k for k in set(stored) | set(recorded) if stored.get(k) != recorded.get(k))
            raise RegistryError(f"{name}:{version}: files {', '.join(differ)} differ from what the trail recorded "
                                "(edited, added or removed outside the registry)")
        return recorded

    def _policy_unlocked(self, name: str) -> ModelPolicy | None:
        """The model's policy once its file matches the trail's last ``policy`` entry (RegistryError if not)."""
        signed = read_policy(self._model_dir(name))
        recorded = [e for e in self.trail(name) if e.get("action") == POLICY]
        want = recorded[-1]["policy_sha256"] if recorded else None
        have = sha256_of(signed.policy) if signed is not None else None
        if want != have:
            raise RegistryError(f"{name}: {POLICY_FILE} does not match the policy its trail records "
                                f"({'missing' if have is None else 'not on the trail' if want is None else 'replaced'}"
                                "): it was changed outside the registry; no alias moves until it is restored")
        return signed.policy if signed is not None else None

    def policy(self, name: str) -> ModelPolicy | None:
        """The model's approval policy (None: none was set)."""
        with self._lock(name):
            return self._policy_unlocked(name)

    def set_policy(self, name: str, signed: SignedPolicy) -> str:
        """Replace ``name``'s policy with ``signed``: signed by an approver of the current policy (of itself
        for the first), and by a second person of the current policy where it enrols two or more
        (:func:`~infra.registry_policy.signatures_needed`). A change one signature short is kept as a
        proposal (``policy.proposed.json``, a ``policy-proposed`` trail entry) until a second approver
        signs the same policy; the change itself is a ``policy`` trail entry holding the signed policy.
        Returns the trail's new head."""
        if signed.policy.model != name:
            raise ApprovalError(f"the policy is for {signed.policy.model!r}, not {name!r}")
        with self._lock(name):
            current = self._policy_unlocked(name)
            proposal = self._model_dir(name) / POLICY_PROPOSAL_FILE
            proposed = self._read_proposal(proposal)
            if proposed is not None and proposed.sha256 == signed.sha256:
                signed = signed.with_signatures(proposed.signatures())  # the earlier valid signatures
            p = signed.policy
            try:
                signers = check_policy_change(signed, current)
            except ApprovalError as exc:
                if exc.code != "cosign":
                    raise
                write_json_atomic(proposal, signed.model_dump(mode="json"))
                return self._append_trail(name, {
                    "action": POLICY_PROPOSED, "policy_sha256": signed.sha256, "policy_seq": p.seq,
                    "signed": signed.model_dump(mode="json"), "reason": str(exc)})
            write_json_atomic(self._model_dir(name) / POLICY_FILE, signed.model_dump(mode="json"))
            proposal.unlink(missing_ok=True)
            names = ", ".join(s.person for s in signers)
            return self._append_trail(name, {
                "action": POLICY, "policy_sha256": signed.sha256, "policy_seq": p.seq, "signed_by": signers[0].person,
                "signers": [s.person for s in signers], "signer_key": signed.public_key,
                "signed": signed.model_dump(mode="json"), "approval_required": p.approval_required,
                "approvers": [a.person for a in p.approvers], "reason": f"policy {p.seq} signed by {names}"})

    @staticmethod
    def _read_proposal(path: Path) -> SignedPolicy | None:
        """The policy change waiting for a second signature (None: none, or a file that does not parse)."""
        try:
            return SignedPolicy.model_validate_json(path.read_text()) if path.exists() else None
        except ValueError:
            log.warning("%s does not parse: ignored (the next signature starts a new proposal)", path)
            return None

    def verify_decision(self, name: str, alias: str, version: int, signed: SignedDecision, *,
                        initiators: list[str], run_id: str | None) -> str:
        """The enrolled approver (person) whose signed decision holds for this move, without moving
        anything (ApprovalError with its ``code`` otherwise: not enrolled, bad signature, another
        move, too old, four eyes); what a waiting run and ``approve`` check before the move itself."""
        with self._lock(name):
            policy = self._policy_unlocked(name)
            if policy is None:
                raise ApprovalError(f"{name} has no approval policy: no approver is enrolled (python -m flows.registry "
                                    "policy)", code="not_approver")
            return check_decision(policy, signed, model=name, version=int(version), alias=alias,
                                  files=self.version_files(name, version),
                                  initiators=initiators, run_id=run_id).person

    def _authorise(self, name: str, alias: str, version: int, approval: Approval | None, *,
                   emergency: bool = False) -> dict[str, Any]:
        """Check (inside the lock) that the policy allows this alias move; returns what the trail
        entry records of the authority. ApprovalError (``code``) when it does not."""
        policy = self._policy_unlocked(name)
        if policy is None or not policy.approval_required:
            return {}
        if emergency and policy.emergency_rollback:
            return {"emergency": True}
        if approval is None or approval.signed is None or not approval.approved:
            raise ApprovalError(f"{name}: moving {alias} to v{version} needs a decision signed by an approver of "
                                f"its policy ({', '.join(a.person for a in policy.approvers)}); ask for it with a flow "
                                "run (approve / the Prefect form)", code="unapproved")
        signed = approval.signed
        approver = check_decision(policy, signed, model=name, version=int(version), alias=alias,
                                  files=self.version_files(name, version),
                                  initiators=[approval.requested_by, current_actor()], run_id=approval.run_id)
        if signed.statement.decision != "approve":
            raise ApprovalError(f"{name}: the signed decision rejects the move", code="unapproved")
        used = signed.sha256
        if any(e.get("decision_sha256") == used for e in self.trail(name) if "alias" in e):
            raise ApprovalError(f"{name}: this signed decision was already used for a move", code="replayed")
        return {"decision_sha256": used, "approved_by": approver.person, "approver_key": signed.public_key}

    def _write_alias(self, name: str, aliases: dict[str, int], alias: str, version: int, action: str,
                     reason: str, comparison: Mapping[str, Any] | None = None,
                     approval: Approval | None = None, emergency: bool = False) -> str:
        """Point ``alias`` at ``version`` and append the move to the trail (inside the lock), once the
        model's policy allows it (:meth:`_authorise`); returns the trail's new head."""
        authority = self._authorise(name, alias, version, approval, emergency=emergency)
        entry: dict[str, Any] = {"alias": alias, "version": int(version), "previous": aliases.get(alias),
                                 "action": action, "reason": reason,
                                 "evidence": self._evidence(name, version, comparison), **authority}
        if approval is not None:
            entry["approval"] = approval.model_dump(mode="json")
        head = self._append_trail(name, entry)
        aliases[alias] = int(version)
        write_json_atomic(self._model_dir(name) / "aliases.json", aliases)
        return head

    def record_event(self, name: str, action: str, *, candidate: int, champion: int | None, reason: str,
                     by: str, run_id: str | None = None, extra: Mapping[str, Any] | None = None) -> str:
        """Append an event that moves no alias (``approval-requested``, ``approved``, ``rejected``,
        ``approval-refused``, ``approval-expired``) to ``name``'s trail; returns the new head.

        The entry names the candidate and the champion it would replace (``candidate`` /
        ``champion``, not ``alias`` / ``version``, so alias checks and rollbacks skip it) and
        carries the candidate's evidence hashes.
        """
        if action not in TRAIL_EVENTS:
            raise ValueError(f"unknown trail event {action!r}; known: {', '.join(TRAIL_EVENTS)}")
        with self._lock(name):
            self.get(name, candidate)
            return self._append_trail(name, {**(extra or {}), "action": action, "candidate": int(candidate),
                                             "champion": champion, "reason": reason, "by": by, "run": run_id,
                                             "evidence": self._evidence(name, candidate, None)})

    def trail_head(self, name: str) -> str | None:
        """The hash of the trail's last line (what a promotion's artifact and card show)."""
        lines = self._trail_lines(name)
        return sha256_text(lines[-1]) if lines else None

    def verify_trail(self, name: str) -> TrailReport:
        """Recompute ``name``'s trail: every ``prev`` link, the head file, ``aliases.json`` against the
        trail's last move of each alias, every version's files and the anchors (:mod:`infra.registry_trail`)."""
        model_dir = self._model_dir(name)  # checks the name
        policy_problem = None
        with self._lock(name) if model_dir.is_dir() else contextlib.nullcontext():
            lines = self._trail_lines(name)
            head_path = model_dir / TRAIL_HEAD_FILE
            head = json.loads(head_path.read_text()) if head_path.exists() else None
            aliases = self._aliases(name)
            try:
                self._policy_unlocked(name)
            except RegistryError as exc:
                policy_problem = str(exc)
            except ValueError as exc:
                policy_problem = f"{POLICY_FILE} cannot be read: {exc}"
            stored = {v: version_file_hashes(model_dir / str(v)) for v in self._versions(model_dir)} \
                if model_dir.is_dir() else {}
        return check_trail(name, lines, head, aliases, stored, policy_problem)

    def _alias_stack(self, name: str, alias: str, current: int | None) -> list[int]:
        """The alias's versions, oldest first, as promotions pushed and rollbacks popped them;
        the last is ``current`` (a move not in the history, e.g. from an older release, is put on top)."""
        stack: list[int] = []
        for entry in self.alias_history(name, alias):
            if entry.get("action") == "rollback":
                if stack:
                    stack.pop()
                if not stack or stack[-1] != entry["version"]:
                    stack.append(int(entry["version"]))
            else:
                if not stack and entry.get("previous") is not None:
                    stack.append(int(entry["previous"]))  # the champion before the history began
                stack.append(int(entry["version"]))
        if current is not None and (not stack or stack[-1] != current):
            stack.append(current)
        return stack

    # -- reading -----------------------------------------------------------------------
    def trail(self, name: str) -> list[dict[str, Any]]:
        """Every entry of ``name``'s trail (moves, events, registrations, documents, policies), oldest first."""
        path = self._model_dir(name) / ALIAS_HISTORY_FILE
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def alias_history(self, name: str, alias: str | None = CHAMPION) -> list[dict[str, Any]]:
        """The recorded moves of ``alias`` (with None: every alias's moves and the approval events),
        oldest first."""
        return [e for e in self.trail(name) if e.get("action") not in (REGISTER, DOCUMENT, POLICY, POLICY_PROPOSED)
                and (alias is None or e.get("alias") == alias)]

    def models(self) -> list[str]:
        """Names of registered models."""
        if not self.root.exists():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self._versions(p))

    @staticmethod
    def _versions(model_dir: Path) -> list[int]:
        return sorted(
            int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()
        )

    def versions(self, name: str) -> list[ModelRef]:
        """All versions of a model, oldest first."""
        model_dir = self._model_dir(name)
        if not model_dir.exists():
            return []
        return [self.get(name, v) for v in self._versions(model_dir)]

    def aliases(self, name: str) -> dict[str, int]:
        """Alias -> version for a model."""
        return self._aliases(name)

    def get(self, name: str, version: int | str = CHAMPION) -> ModelRef:
        """A version by number, ``latest``, or an alias (``champion`` by default)."""
        model_dir = self._model_dir(name)
        if not model_dir.exists() or not self._versions(model_dir):
            known = ", ".join(self.models()) or "none"
            raise RegistryError(f"no model named {name!r} in {self.root} (registered: {known})")
        if isinstance(version, str) and not version.isdigit():
            if version == "latest":
                number = self._versions(model_dir)[-1]
            else:
                aliases = self._aliases(name)
                if version not in aliases:
                    raise RegistryError(
                        f"model {name!r} has no alias {version!r} (aliases: {sorted(aliases)}; "
                        f"versions: {self._versions(model_dir)})"
                    )
                number = aliases[version]
        else:
            number = int(version)
        meta_path = model_dir / str(number) / META_FILE
        if not meta_path.exists():
            raise RegistryError(
                f"model {name!r} has no version {number} (versions: {self._versions(model_dir)})"
            )
        meta = json.loads(meta_path.read_text())
        return ModelRef(**meta, path=str(meta_path.parent))

    def resolve(self, spec: str) -> ModelRef:
        """A version from ``name[:version|alias]``."""
        name, version = parse_model_spec(spec)
        return self.get(name, version)

    def champion(self, name: str) -> ModelRef | None:
        """The current champion, or None."""
        aliases = self._aliases(name) if self._model_dir(name).exists() else {}
        return self.get(name, aliases[CHAMPION]) if CHAMPION in aliases else None

    def load_state_dict(self, ref: ModelRef) -> dict[str, Any]:
        """The version's tensors, read with safetensors (no pickle involved), decrypted in memory
        when the registry is encrypted at rest (infra.sealed)."""
        from safetensors.torch import load, load_file

        if sealed.stored_plain(ref.weights_path):
            return load_file(str(ref.weights_path))
        return load(sealed.read_artifact(ref.weights_path))

    def rotate_key(self, old: sealed.KeyWrapper, new: sealed.KeyWrapper) -> sealed.RotationReport:
        """Rewrap every sealed version's data key from ``old`` to ``new`` (each model inside its lock);
        no stored file changes. Versions already under ``new`` are skipped, so a broken run can be re-run."""
        rewrapped = current = 0
        models = []
        for model_dir in sealed.iter_model_dirs(self.root):
            with self._lock(model_dir.name):
                done, already = sealed.rewrap_model(model_dir, old, new)
            rewrapped, current = rewrapped + done, current + already
            models.append(model_dir.name)
        log.info("rewrapped %d data keys under %s (%d already were)", rewrapped, new.key_id, current)
        return sealed.RotationReport(new_key=new.key_id, rewrapped=rewrapped, already_current=current, models=models)

    # -- writing -----------------------------------------------------------------------
    def register(
        self,
        name: str,
        state_dict: Mapping[str, Any],
        *,
        params: Mapping[str, Any],
        metrics: Mapping[str, float],
        primary_metric: str,
        higher_is_better: bool = True,
        data_hash: str | None = None,
        parent: str | None = None,
        kind: str = "torch",
        tags: Mapping[str, str] | None = None,
        extra_files: Mapping[str, Path] | None = None,
    ) -> ModelRef:
        """Write a new version; the folder appears atomically or not at all. With a registry key
        (``INDUSFLOW_REGISTRY_KEY``) the model artifacts are written sealed (infra.sealed)."""
        from safetensors.torch import save

        if primary_metric not in metrics:
            raise ValueError(
                f"primary metric {primary_metric!r} is not among the metrics {sorted(metrics)}"
            )
        json.dumps(dict(params))  # fail early, before writing, on non-JSON params
        tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
        kek = sealed.configured_key()
        with self._lock(name):
            model_dir = self._model_dir(name)
            existing = self._versions(model_dir)
            version = (existing[-1] + 1) if existing else 1
            staging = Path(tempfile.mkdtemp(prefix=f".staging-{version}-", dir=model_dir))
            try:
                key = sealed.new_version_key(model_dir, name, version, kek) if kek is not None else None
                if key is None:
                    sealed.forget_version_key(model_dir, version)  # a stale entry of a registration killed midway
                sealed.write_artifact(staging / WEIGHTS_FILE, save(tensors), key)
                for file_name, src in (extra_files or {}).items():
                    target = safe_join(staging, check_name(file_name, "file name"))
                    if key is not None and sealed.is_artifact(file_name):
                        sealed.write_artifact(target, Path(src).read_bytes(), key)
                    else:
                        shutil.copyfile(src, target)
                meta = {
                    "name": name,
                    "version": version,
                    "kind": kind,
                    "params": dict(params),
                    "metrics": {k: float(v) for k, v in metrics.items()},
                    "primary_metric": primary_metric,
                    "higher_is_better": higher_is_better,
                    "data_hash": data_hash,
                    "git_commit": current_git_commit(),
                    "created_at": dt.datetime.now(dt.UTC).isoformat(),
                    "parent": parent,
                    "tags": dict(tags or {}),
                }
                (staging / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
                os.rename(staging, model_dir / str(version))
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                sealed.forget_version_key(model_dir, version)
                raise
            self._append_trail(name, {"action": REGISTER, "version": version, "reason": "registered",
                                      "files": version_file_hashes(model_dir / str(version))})
        log.info("registered %s:%d (%s=%s)", name, version, primary_metric, metrics[primary_metric])
        return self.get(name, version)

    def write_version_file(self, ref: ModelRef, file_name: str, text: str) -> Path:
        """Write (atomically) a document about a version into its folder, e.g. a model card.
        The weights and ``meta.json`` cannot be overwritten this way."""
        if file_name in {WEIGHTS_FILE, META_FILE}:
            raise ValueError(f"{file_name} of a version is written once, at registration")
        folder = Path(self.get(ref.name, ref.version).path)
        target = safe_join(folder, check_name(file_name, "file name"))
        with self._lock(ref.name):
            tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
            tmp.write_text(text)
            os.replace(tmp, target)
            self._append_trail(ref.name, {"action": DOCUMENT, "version": ref.version, "file": target.name,
                                          "sha256": sha256_file(target), "reason": f"{target.name} written"})
        return target

    def set_alias(self, name: str, alias: str, version: int, reason: str = "set_alias",
                  approval: Approval | None = None) -> bool:
        """Point an alias at a version (no quality gate: use :meth:`promote` for champion); the move
        is on the trail with ``reason``. A model whose policy requires approval needs ``approval``
        (a signed decision for this alias and version). False when the alias already pointed there."""
        check_name(alias, "alias")
        with self._lock(name):
            self.get(name, version)
            aliases = self._aliases(name)
            if aliases.get(alias) == int(version):
                return False
            if approval is not None:
                reason += f"; approved by {approval.decided_by}: {approval.reason}"
            self._write_alias(name, aliases, alias, version, "set", reason, approval=approval)
            return True

    def clear_alias(self, name: str, alias: str, reason: str = "clear_alias") -> int | None:
        """Remove an alias other than ``champion`` (a challenger taken out of serving); the removal
        is on the trail. Returns the version it pointed at (None: it was not set)."""
        check_name(alias, "alias")
        if alias == CHAMPION:
            raise RegistryError("the champion alias is not cleared: promote another version or roll back")
        with self._lock(name):
            aliases = self._aliases(name)
            previous = aliases.pop(alias, None)
            if previous is None:
                return None
            self._append_trail(name, {"alias": alias, "version": None, "previous": previous, "action": "clear",
                                      "reason": reason, "evidence": self._evidence(name, previous, None)})
            write_json_atomic(self._model_dir(name) / "aliases.json", aliases)
            return previous

    def promote(
        self,
        candidate: ModelRef,
        *,
        champion_value: float | None = None,
        min_delta: float = 0.0,
        strict: bool = False,
        comparison: ChampionComparison | None = None,
        recompare: Callable[[ModelRef], ChampionComparison | None] | None = None,
        alpha: float | None = None,
        force: bool = False,
        decide_only: bool = False,
        approval: Approval | None = None,
    ) -> PromotionDecision:
        """Move ``champion`` to ``candidate`` only if it beats the current champion.

        Compare-and-swap: the champion is read inside the registry lock. A ``comparison``
        made against another version (a champion promoted meanwhile by another run) is
        stale: it is made again inside the lock with ``recompare`` or, without one, the
        current champion's recorded metric is compared (and no p-value is known).

        Args:
            candidate: a registered version.
            champion_value: the current champion's primary metric on the candidate's data,
                with no version attached: trusted only when no ``comparison`` is given and
                no other champion appeared since (the version is checked inside the lock).
            min_delta: the margin by which the candidate must win (a tie never wins: :func:`beats`).
            strict: raise :class:`QualityGateError` when the candidate is not promoted.
            comparison: the candidate compared with a named champion version.
            recompare: compares the candidate with a given champion version (called inside
                the lock when ``comparison`` names a version that is no longer champion).
            alpha: significance gate: also require the paired-bootstrap p-value < alpha
                (None: off). A missing p-value fails the gate.
            force: move the alias whatever the metrics say (a promotion by hand); the
                champion it replaces is still read inside the lock and recorded in the history.
            decide_only: apply the rule and move nothing; a win comes back with
                ``promoted=False, awaiting_approval=True`` (the model needs approval first).
            approval: the approval this move got (recorded in the trail entry and the decision);
                the rule is applied again here, inside the lock, so a champion that moved while
                the approval was pending is compared anew.
        """
        metric = candidate.primary_metric
        value = candidate.primary_value()
        p_value: float | None = None
        rescored = False
        with self._lock(candidate.name):
            aliases = self._aliases(candidate.name)
            current = self.get(candidate.name, aliases[CHAMPION]) if CHAMPION in aliases else None
            if current is not None and current.version != candidate.version:
                if comparison is None and champion_value is not None:
                    comparison = ChampionComparison(champion_version=current.version, champion_value=champion_value)
                if comparison is not None and comparison.champion_version != current.version:
                    log.info("champion of %s moved from v%d to v%d since the comparison: comparing again",
                             candidate.name, comparison.champion_version, current.version)
                    comparison = recompare(current) if recompare is not None else None
                    rescored = True
                if comparison is not None and comparison.champion_version == current.version:
                    champion_value, p_value = comparison.champion_value, comparison.p_value
                else:
                    champion_value = None
                if champion_value is None:
                    champion_value = current.metrics.get(metric)
            if force:
                promoted = True
                reason = ("candidate is already the champion" if current is not None
                          and current.version == candidate.version
                          else f"promoted by hand (champion before: {f'v{current.version}' if current else 'none'})")
            elif value is None:
                promoted, reason = False, f"candidate has no {metric}"
            elif current is None:
                promoted, reason = True, "no champion yet"
            elif current.version == candidate.version:
                promoted, reason = True, "candidate is already the champion"
            elif champion_value is None:
                promoted, reason = True, f"champion v{current.version} has no {metric}"
            elif beats(value, champion_value, higher_is_better=candidate.higher_is_better, min_delta=min_delta):
                promoted = True
                reason = (
                    f"{metric} {value:.4f} beats champion v{current.version} "
                    f"{champion_value:.4f} by more than {min_delta}"
                )
                if alpha is not None and (p_value is None or p_value >= alpha):
                    promoted = False
                    reason = (
                        f"{metric} {value:.4f} beats champion v{current.version} {champion_value:.4f}, "
                        + ("but no paired test against it is known" if p_value is None
                           else f"but not significantly (paired bootstrap p={p_value:.3f} >= alpha {alpha})")
                    )
                elif alpha is not None:
                    reason += f", significantly (paired bootstrap p={p_value:.3f} < alpha {alpha})"
            else:
                promoted = False
                reason = (
                    f"{metric} {value:.4f} does not beat champion v{current.version} "
                    f"{champion_value:.4f} (needs a margin > {min_delta}; a tie keeps the champion)"
                )
            moves = promoted and aliases.get(CHAMPION) != candidate.version
            awaiting = decide_only and moves
            trail = None
            if awaiting:
                promoted = False
            elif moves:
                if approval is not None:
                    reason += f"; approved by {approval.decided_by}: {approval.reason}"
                trail = self._write_alias(candidate.name, aliases, CHAMPION, candidate.version,
                                  "force" if force else "promote", reason,
                                  comparison={"metric": metric, "candidate_value": value,
                                              "champion_version": current.version if current else None,
                                              "champion_value": champion_value, "p_value": p_value,
                                              "min_delta": min_delta, "alpha": alpha},
                                  approval=approval)
            if trail is None:
                trail = self.trail_head(candidate.name)
        decision = PromotionDecision(
            name=candidate.name,
            metric=metric,
            candidate_version=candidate.version,
            candidate_value=value,
            champion_version=current.version if current else None,
            champion_value=champion_value,
            promoted=promoted,
            reason=reason,
            p_value=p_value,
            alpha=alpha,
            rescored_in_lock=rescored,
            trail_sha256=trail,
            approval=approval,
            awaiting_approval=awaiting,
        )
        log.info("promotion of %s: %s%s", candidate.spec, reason, " (awaits approval)" if awaiting else "")
        if strict and not promoted and not awaiting:
            raise QualityGateError(f"{candidate.spec} not promoted: {reason}")
        return decision

    def rollback(self, name: str, alias: str = CHAMPION, *, note: str | None = None, decide_only: bool = False,
                 approval: Approval | None = None, expect: tuple[int, int] | None = None,
                 emergency: bool = False) -> PromotionDecision:
        """Return ``alias`` to the version it pointed at before the current one (from the history).

        Args:
            note: why, appended to the trail entry's reason (e.g. "emergency: ...").
            decide_only: name the version it would return to and move nothing
                (``awaiting_approval``); an approved rollback then passes ``approval``.
            approval: the approval this rollback got (recorded in the trail entry).
            expect: (from, to) versions the rollback must still be, checked inside the lock (an
                approved rollback: the champion may have moved while it waited).
            emergency: move at once where the model's policy allows emergency rollbacks
                (recorded as such); otherwise a gated model needs ``approval``.

        Raises:
            RegistryError: the model is unknown, has no such alias, or no earlier version is
                recorded (a home written before the history existed).
        """
        check_name(alias, "alias")
        with self._lock(name):
            aliases = self._aliases(name)
            if alias not in aliases:
                self.get(name, alias)  # names the model's aliases and versions
            current = self.get(name, aliases[alias])
            stack = self._alias_stack(name, alias, current.version)
            if len(stack) < 2:
                raise RegistryError(f"{name}@{alias} is v{current.version} and no earlier {alias} is recorded "
                                    f"in {ALIAS_HISTORY_FILE}; promote a version by hand instead")
            target = self.get(name, stack[-2])
            if expect is not None and expect != (current.version, target.version):
                raise RegistryError(f"{name}@{alias} moved while the rollback waited for approval (v{expect[0]} -> "
                                    f"v{expect[1]} was approved; now v{current.version} -> v{target.version}); "
                                    "roll back again")
            reason = f"rolled back from v{current.version} to v{target.version} (the {alias} before it)"
            if note:
                reason += f": {note}"
            if approval is not None:
                reason += f"; approved by {approval.decided_by}: {approval.reason}"
            if decide_only:
                trail = self.trail_head(name)
            else:
                trail = self._write_alias(name, aliases, alias, target.version, "rollback", reason, approval=approval,
                                          emergency=emergency)
        log.info("%s@%s: %s%s", name, alias, reason, " (awaits approval)" if decide_only else "")
        return PromotionDecision(
            name=name, metric=target.primary_metric, candidate_version=target.version,
            candidate_value=target.primary_value(), champion_version=current.version,
            champion_value=current.primary_value(), promoted=not decide_only, reason=reason, trail_sha256=trail,
            approval=approval, awaiting_approval=decide_only)
