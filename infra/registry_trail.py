"""What :meth:`infra.registry.ModelRegistry.verify_trail` checks, as plain functions over what it read
inside the registry lock: the trail's lines, its head file, ``aliases.json``, the hashes of the
version folders as stored, and the anchors outside the folder.

A line of the trail (``alias_history.jsonl``) is one JSON entry chained to the line before by
``prev`` (the SHA-256 of that line); the head file holds the number of lines and the last line's
hash. :func:`check_trail` recomputes the chain and the head, compares the aliases with the trail's
last move of each, re-hashes every version's files against its ``register`` and ``document``
entries, and checks the head against every configured anchor; without an anchor the report is only
"unanchored".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, computed_field

from infra.errors import ApprovalError
from infra.registry_anchor import check_anchor, configured_anchors
from infra.registry_policy import (
    ModelPolicy,
    SignedDecision,
    SignedPolicy,
    check_policy_change,
    decision_signer,
)

ALIAS_HISTORY_FILE = "alias_history.jsonl"
TRAIL_HEAD_FILE = "alias_history.head.json"
#: Trail entries about a version's files and the model's policy (no alias moves).
REGISTER, DOCUMENT, POLICY = "register", "document", "policy"
#: A policy change waiting for a second approver's signature (no change yet).
POLICY_PROPOSED = "policy-proposed"


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TrailProblem(BaseModel):
    """One thing :meth:`~infra.registry.ModelRegistry.verify_trail` found wrong."""

    model_config = ConfigDict(frozen=True)

    line: int | None = Field(description="1-based line of alias_history.jsonl (None: the file as a whole).")
    problem: str


class TrailReport(BaseModel):
    """The verification of one model's registry trail."""

    model_config = ConfigDict(frozen=True)

    name: str
    entries: int
    chained: int = Field(description="Entries with a hash link to the line before (or the first line).")
    unchained: int = Field(description="Lines written before the trail was hash-chained (not verifiable).")
    head_sha256: str | None
    ok: bool = Field(description="No problem found (the chain, the files, the aliases, the policy, the anchors).")
    problems: list[TrailProblem]
    files_checked: int = Field(default=0, description="Version files re-hashed against their trail entries.")
    anchors: list[str] = Field(default_factory=list, description="The anchors the head was checked against.")
    anchored: int = Field(default=0, description="Entries pinned by every anchor (0: none configured).")
    unproven: list[str] = Field(default_factory=list, description="What could not be proven (no anchor, versions "
                                "registered before file hashing).")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> str:
        """``failed`` (a problem), ``unanchored`` (consistent, but nothing outside the folder pins it), or ``ok``."""
        return "failed" if not self.ok else "unanchored" if not self.anchors else "ok"


def recorded_files(entries: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, str]]:
    """Version -> file -> SHA-256, as the trail's ``register`` and ``document`` entries recorded them."""
    out: dict[int, dict[str, str]] = {}
    for e in entries:
        add_files(out, e)
    return out


def add_files(files: dict[int, dict[str, str]], e: Mapping[str, Any]) -> None:
    """Add what a ``register`` or ``document`` entry records to ``files`` (version -> file -> SHA-256)."""
    if e.get("action") == REGISTER:
        files[int(e["version"])] = dict(e["files"])
    elif e.get("action") == DOCUMENT and int(e["version"]) in files:
        files[int(e["version"])][str(e["file"])] = str(e["sha256"])


def json_or_none(line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return None


def check_chain(lines: Sequence[str], head: Mapping[str, Any] | None) -> tuple[list[TrailProblem], int, int]:
    """(problems, chained, unchained) of the hash links, sequence numbers and the head file."""
    problems: list[TrailProblem] = []
    chained = unchained = 0
    for i, line in enumerate(lines):
        entry = json_or_none(line)
        if not isinstance(entry, dict):
            problems.append(TrailProblem(line=i + 1, problem="not a JSON object"))
            continue
        if "prev" not in entry:
            if chained:
                problems.append(TrailProblem(line=i + 1, problem="an entry without a hash link after the "
                                             "chain began (inserted or edited)"))
            unchained += 1
            continue
        chained += 1
        want = sha256_text(lines[i - 1]) if i else None
        if entry["prev"] != want:
            problems.append(TrailProblem(line=i + 1, problem=(
                "the line before it was edited or removed (its hash link does not match)" if i
                else "the first line links to an earlier one: the start of the trail was removed")))
        if entry.get("seq") is not None and entry["seq"] != i + 1:
            problems.append(TrailProblem(line=i + 1, problem=f"sequence number {entry['seq']}, "
                                         f"expected {i + 1}: lines were removed or reordered"))
    if chained:
        if head is None:
            problems.append(TrailProblem(line=None, problem=f"{TRAIL_HEAD_FILE} is missing"))
        elif head.get("entries") != len(lines) or head.get("last_sha256") != sha256_text(lines[-1]):
            problems.append(TrailProblem(line=None, problem=(
                f"{TRAIL_HEAD_FILE} says {head.get('entries')} entries ending in "
                f"{str(head.get('last_sha256'))[:12]}…; the trail has {len(lines)}: the last lines were "
                "edited, removed or appended outside the registry")))
    elif head is not None:
        problems.append(TrailProblem(line=None, problem=f"{TRAIL_HEAD_FILE} exists but the trail has no "
                                     "chained entry: the trail was replaced"))
    return problems, chained, unchained


def check_aliases(entries: Sequence[Mapping[str, Any]], aliases: Mapping[str, int]) -> list[str]:
    """``aliases.json`` against the trail's last move of each alias."""
    last: dict[str, int | None] = {}
    for entry in entries:
        if "alias" in entry and "version" in entry:
            last[str(entry["alias"])] = None if entry["version"] is None else int(entry["version"])
    problems = []
    for alias, version in sorted(aliases.items()):
        if alias in last and last[alias] != version:
            moved = "cleared it" if last[alias] is None else f"at v{last[alias]}"
            problems.append(f"aliases.json points {alias} at v{version}, the trail's last move {moved}: "
                            "the alias was moved outside the registry")
    for alias, moved_to in sorted(last.items()):
        if moved_to is not None and alias not in aliases:
            problems.append(f"aliases.json has no {alias}, the trail's last move points it at v{moved_to}: "
                            "the alias was removed outside the registry")
    return problems


def check_files(recorded: dict[int, dict[str, str]],
                stored: dict[int, dict[str, str]]) -> tuple[list[str], list[str]]:
    """(problems, unproven) of the version folders on disk against their trail entries."""
    problems, unproven = [], []
    first = min(recorded) if recorded else None
    for version, files in sorted(stored.items()):
        want = recorded.get(version)
        if want is None:
            if first is None or version < first:
                unproven.append(f"v{version} was registered before files were hashed: its files are not proven")
            else:
                problems.append(f"v{version}: the folder has no registration entry on the trail "
                                "(written or swapped in outside the registry)")
            continue
        differ = sorted(k for k in set(files) | set(want) if files.get(k) != want.get(k))
        if differ:
            problems.append(f"v{version}: {', '.join(differ)} differ from the trail's hashes "
                            "(edited, added, removed, or the folder was swapped with another version's)")
    for version in sorted(set(recorded) - set(stored)):
        problems.append(f"v{version} is registered on the trail but its folder is gone")
    return problems, unproven


#: Trail actions of an alias move the policy authorises (``clear`` takes a challenger out: no approval).
AUTHORISED_MOVES = ("set", "promote", "force", "rollback")
#: Trail events that record a signed decision given to a waiting run (tasks.approval).
DECISION_EVENTS = ("approved", "rejected")


def _signed_decision_problem(entry: Mapping[str, Any], signed: Any, policy: ModelPolicy, name: str,
                             files: Mapping[int, Mapping[str, str]]) -> str | None:
    """What is wrong with a trail entry's signed decision (None: it holds for this entry)."""
    try:
        approver = decision_signer(policy, signed, name)
    except ApprovalError as exc:
        return str(exc)
    s = signed.statement
    if "alias" in entry:  # a move: the decision is about this alias and version
        version, alias = entry.get("version"), entry.get("alias")
        said = {"decision_sha256": signed.sha256, "approved_by": approver.person, "approver_key": signed.public_key}
        if any(entry.get(k) != v for k, v in said.items()):
            return "the entry's approver or decision hash is not the signed decision's"
    else:  # an approval event: the decision is about the candidate, and says what the event says
        version, alias = entry.get("candidate"), entry.get("for_alias", s.alias)
        if (entry.get("by"), entry.get("run"), entry.get("action")) != (
                approver.person, s.run_id, "approved" if s.decision == "approve" else "rejected"):
            return "the entry's approver, run or outcome is not the signed decision's"
    if (s.model, s.version, s.alias) != (name, version, alias):
        return f"the signed decision is about {s.model}@{s.alias} v{s.version}, the entry about {alias} v{version}"
    if version is not None and s.files != dict(files.get(int(version), {})):
        return "the signed decision's file hashes are not those the trail recorded for that version"
    return None


def check_signatures(name: str, entries: Sequence[tuple[int, Mapping[str, Any]]]) -> tuple[list[TrailProblem],
                                                                                            list[str]]:
    """(problems, unproven) of the signatures the trail holds: every policy change against the policy
    before it (two people where it enrolled two), every signed decision of a move or an approval event
    against the policy then in force (an enrolled key, a valid signature over what the entry says), and
    no authorised move of a gated model without one. An edited entry fails here even when the trail
    was re-chained."""
    problems: list[TrailProblem] = []
    unproven: list[str] = []
    policy: ModelPolicy | None = None
    known = True  # every policy so far was recorded in full
    files: dict[int, dict[str, str]] = {}
    for line, e in entries:
        action = e.get("action")
        if action in (REGISTER, DOCUMENT):
            add_files(files, e)
            continue
        if action == POLICY:
            if "signed" not in e:
                known, policy = False, None
                unproven.append(f"line {line}: a policy recorded before policies were kept in full on the trail: "
                                "its signatures and those of the moves after it are not proven")
                continue
            try:
                signed_policy = SignedPolicy.model_validate(e["signed"])
                if signed_policy.sha256 != e.get("policy_sha256"):
                    raise ApprovalError("the entry's policy hash is not its signed policy's")
                check_policy_change(signed_policy, policy)
            except (ApprovalError, ValueError) as exc:
                problems.append(TrailProblem(line=line, problem=f"policy change: {exc}"))
                continue
            policy, known = signed_policy.policy, True
            continue
        if "alias" in e:
            signed_raw = (e.get("approval") or {}).get("signed")
        elif action in DECISION_EVENTS:
            signed_raw = e.get("signed")
        else:  # another event (requested, refused, expired, a policy proposal): nothing signed it holds counts
            continue
        if signed_raw is None:
            if (known and policy is not None and policy.approval_required and action in AUTHORISED_MOVES
                    and not e.get("emergency")):
                problems.append(TrailProblem(line=line, problem=f"{action} of {e.get('alias')} to v{e.get('version')} "
                                             "without a signed decision although the policy then required one"))
            continue
        if not known or policy is None:
            continue
        try:
            signed = SignedDecision.model_validate(signed_raw)
        except ValueError:
            problems.append(TrailProblem(line=line, problem="the signed decision cannot be read"))
            continue
        why = _signed_decision_problem(e, signed, policy, name, files)
        if why is not None:
            problems.append(TrailProblem(line=line, problem=f"signed decision: {why} (edited after it was written)"))
    return problems, unproven


def check_trail(name: str, lines: Sequence[str], head: Mapping[str, Any] | None, aliases: Mapping[str, int],
                stored: dict[int, dict[str, str]], policy_problem: str | None = None) -> TrailReport:
    """The report of ``name``'s trail (see the module docstring); ``stored`` is the hashes of the version
    folders on disk, ``policy_problem`` what reading the policy file found wrong."""
    problems = [TrailProblem(line=None, problem=policy_problem)] if policy_problem is not None else []
    chain_problems, chained, unchained = check_chain(lines, head)
    problems += chain_problems
    numbered = [(i + 1, e) for i, e in enumerate(json_or_none(line) for line in lines) if isinstance(e, dict)]
    entries = [e for _, e in numbered]
    problems += [TrailProblem(line=None, problem=p) for p in check_aliases(entries, aliases)]
    file_problems, unproven = check_files(recorded_files(entries), stored)
    problems += [TrailProblem(line=None, problem=p) for p in file_problems]
    signature_problems, not_proven = check_signatures(name, numbered)
    problems += signature_problems
    unproven += not_proven
    heads = [sha256_text(line) for line in lines]
    anchors = configured_anchors()
    pinned = []
    for anchor in anchors:
        count, found = check_anchor(anchor, name, heads)
        pinned.append(count)
        problems += [TrailProblem(line=None, problem=p) for p in found]
    if not anchors:
        unproven.insert(0, "no anchor is configured (INDUSFLOW_GOVERNANCE_TRAIL_ANCHORS): the trail is only "
                        "consistent with itself; a trail rewritten, re-chained or deleted as a whole is not "
                        "detectable")
    return TrailReport(name=name, entries=len(lines), chained=chained, unchained=unchained,
                       head_sha256=heads[-1] if heads else None, ok=not problems,
                       problems=problems, files_checked=sum(len(f) for f in stored.values()),
                       anchors=[a.name for a in anchors], anchored=min(pinned) if pinned else 0,
                       unproven=unproven)
