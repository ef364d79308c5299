"""The command blocks of README.md and of every page under docs/, read the way a user reads them.

A command block is a code block indented by 4 spaces, or a fenced block whose language is
``bash``/``sh``/``shell``/``console`` (a fence of any other language, or none, is not a command
block: JSON bodies, YAML, the layer picture). Its lines are joined into logical commands (a
trailing ``\\`` or an open quote continues a line; a line of only a ``#`` comment is a comment).
What a page says about a block, it says in an HTML comment right before it:

    <!-- docs-test: skip (needs Docker) -->              the whole block is not run here
    <!-- docs-test: skip "docker build" (needs Docker) -->  the block's lines holding that text
    <!-- docs-test: not commands (the repository layout) -->  a code block that is no command

Every skip names its reason, and the harness prints every skipped line with it. A command
in synopsis notation (``[--opt]``, ``a|b``, an UPPER_CASE placeholder) is not runnable as
written; it is allowed only when some page also shows a concrete, runnable line of the
same command.

Which test section runs a command is :data:`SECTIONS`: a page, and optionally a heading of it.
Each section runs in a home of its own: a fresh one, or a copy of the home another section
left (``needs``: serving starts where the fraud and sensor guides left their champions).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w-]*)")
SHELL_FENCES = {"bash", "sh", "shell", "console"}
SKIP_LINES = re.compile(r'^skip\s+"([^"]+)"\s+\((.+)\)$')
SKIP_BLOCK = re.compile(r"^skip\s+\((.+)\)$")
NOT_COMMANDS = re.compile(r"^not commands\s+\((.+)\)$")
HEADING = re.compile(r"^(#{1,6})\s+(.*)$")

@dataclass(frozen=True)
class Section:
    """Commands of one page (under one of its headings, when ``heading`` is set) run as one test."""

    name: str
    page: str  #: relative to the repository root
    heading: str = ""  #: a prefix of an enclosing heading; "": the page's commands no other section takes
    #: the section whose finished home this one starts from (a copy of it); "": a fresh home
    needs: str = ""


#: Every runnable command belongs to one section. A section's home is a copy of the home its
#: ``needs`` left (that section runs first when it has not yet run), so one selected alone runs
#: exactly its chain of needs and the whole list runs each section once.
SECTIONS: list[Section] = [
    Section("readme_fraud", "README.md", "1. Fraud"),
    Section("readme_sensor", "README.md", "2. Sensor", needs="readme_fraud"),  # the README's runs, in order
    Section("readme_kb", "README.md", "3. Knowledge base", needs="readme_sensor"),  # serves both champions
    Section("fraud_flows", "docs/fraud.md", "Train and score"),
    Section("rag", "docs/rag.md"),
    # tuning and compression need a fraud champion, any: the README's, so that they run beside the long chain
    # of the fraud guide's sections (the docs tier runs a chain on one worker: --dist loadgroup)
    Section("fraud_tune", "docs/fraud.md", "Tuning", needs="readme_fraud"),  # the champion rule meets a champion
    # after the fraud guide: the homes that start from it hold both verticals' champions
    Section("sensor", "docs/sensor.md", needs="fraud_flows"),
    Section("forecasting", "docs/forecasting.md", "Commands"),
    Section("compress", "docs/fraud.md", "Compression", needs="readme_fraud"),  # --model fraud-seq
    Section("governance", "docs/governance.md", "Lineage", needs="sensor"),  # fraud-seq:2, sensor-rul:1
    Section("federated", "docs/fraud.md", "Federated training"),
    Section("model_risk", "docs/governance.md", needs="governance"),  # promotes the version governance trained
    # the champion model_risk promoted (the GBM, trained on data like incoming/next-days): with the
    # adapted champion fraud_flows leaves, the Ray batch flags score drift (a WARNING); with the README's
    # GRU too (score PSI 0.93, 2026-12-07)
    Section("deployments", "docs/deployments.md", needs="model_risk"),
    Section("serving", "docs/serving.md", needs="sensor"),  # both champions loaded
    Section("kb_api", "docs/kb.md"),
    Section("configuration", "docs/configuration.md"),  # a settings file and a flow's config file: a fresh home
]
SECTION_NAMES = [s.name for s in SECTIONS]
BY_NAME = {s.name: s for s in SECTIONS}


def chain(name: str) -> list[str]:
    """The sections ``name`` starts from, first first, then ``name``."""
    out = [name]
    while BY_NAME[out[0]].needs:
        out.insert(0, BY_NAME[out[0]].needs)
    return out


def pages() -> list[Path]:
    """README.md and every Markdown page of the documentation site (not the example files under it)."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "examples" not in p.relative_to(DOCS).parts)]


#: What a command's first word may be (after VAR=value prefixes).
PROGRAMS = (".venv/bin/", "make", "curl", "export", "printf", "docker", "kubectl", "prefect", "openssl")

_QUOTED = re.compile(r"'[^']*'|\"(?:[^\"\\]|\\.)*\"")
_PLACEHOLDER_WORD = re.compile(r"(?<![$\w{=,-])[A-Z][A-Z0-9_]{2,}\b(?!=)")
HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"}


@dataclass
class Command:
    """One logical command line of a block."""

    text: str  #: as written (physical lines joined with newlines, indent removed)
    lineno: int  #: page line of its first physical line
    heading: str
    section: str | None
    page: str = "README.md"  #: relative to the repository root
    skip: str | None = None  #: why it is not run (None: run)

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0]

    @property
    def where(self) -> str:
        return f"{self.page}:{self.lineno}"


@dataclass
class Block:
    lineno: int
    heading: str
    raw: list[tuple[int, str]]
    page: str = "README.md"
    headings: tuple[str, ...] = ()  #: the enclosing headings, outermost first
    markers: list[str] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    not_commands: str | None = None
    unused_line_skips: list[str] = field(default_factory=list)


def section_of(page: str, headings: tuple[str, ...]) -> str | None:
    """The section a command of ``page`` under ``headings`` belongs to (a heading match wins)."""
    on_page = [s for s in SECTIONS if s.page == page]
    for s in on_page:
        if s.heading and any(h.startswith(s.heading) for h in headings):
            return s.name
    return next((s.name for s in on_page if not s.heading), None)


def _complete(text: str) -> bool:
    if text.rstrip().endswith("\\"):
        return False
    try:
        shlex.split(text, comments=True)
    except ValueError:  # an open quote: the command goes on on the next line
        return False
    return True


def strip_quotes_and_comment(text: str) -> str:
    """The command without its quoted strings and its trailing comment (for notation checks)."""
    unquoted = _QUOTED.sub("''", text)
    return unquoted.split("#", 1)[0] if "#" in unquoted else unquoted


def synopsis_marks(text: str) -> list[str]:
    """Placeholder notation in a command (empty: runnable as written)."""
    bare = strip_quotes_and_comment(text)
    marks = []
    if "[" in bare or "]" in bare:
        marks.append("[optional] groups")
    if "|" in bare:
        marks.append("a|b alternatives")
    marks += [f"placeholder {w}" for w in _PLACEHOLDER_WORD.findall(bare) if w not in HTTP_METHODS]
    return marks


def command_key(text: str) -> str:
    """The command a line runs, without its options: ``.venv/bin/python -m flows.rag ingest``."""
    words = strip_quotes_and_comment(text).replace("\\\n", " ").split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    key = words[:1]
    rest = words[1:]
    if rest[:1] == ["-m"] and len(rest) > 1:
        key += rest[:2]
        rest = rest[2:]
    for w in rest:
        if not re.fullmatch(r"[a-z][a-z-]*", w):
            break
        key.append(w)
    return " ".join(key)


def _is_command(text: str) -> bool:
    words = strip_quotes_and_comment(text).replace("\\\n", " ").split()
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    return bool(words) and any(words[0].startswith(p) for p in PROGRAMS)


def parse(path: Path = README) -> list[Block]:
    """The code blocks of one page."""
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
    blocks: list[Block] = []
    headings: list[tuple[int, str]] = []  # (level, text) of the enclosing headings
    markers: list[str] = []
    prev_blank = True
    i = 0
    while i < len(lines):
        line = lines[i]
        m = HEADING.match(line)
        if m:
            level = len(m.group(1))
            headings = [h for h in headings if h[0] < level] + [(level, m.group(2).strip())]
        markers += MARKER.findall(line)
        heading = headings[-1][1] if headings else ""
        path_ = tuple(h for _, h in headings)
        if fence := FENCE.match(line):
            raw = []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence.group(1)):
                if lines[i].strip():
                    raw.append((i + 1, lines[i]))
                i += 1
            i += 1
            if raw:
                block = Block(raw[0][0], heading, raw, page, path_, markers)
                if fence.group(2) not in SHELL_FENCES:
                    block.not_commands = f"a ```{fence.group(2)} block"
                blocks.append(block)
            markers = []
            prev_blank = False
            continue
        if prev_blank and line.startswith("    ") and line.strip():
            raw = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                if lines[i].strip():
                    raw.append((i + 1, lines[i][4:]))
                elif i + 1 < len(lines) and not lines[i + 1].startswith("    "):
                    break
                i += 1
            blocks.append(Block(raw[0][0], heading, raw, page, path_, markers))
            markers = []
            prev_blank = False
            continue
        prev_blank = not line.strip()
        i += 1
    for block in blocks:
        _read_block(block)
    return blocks


def parse_all() -> list[Block]:
    """The code blocks of README.md and of every docs page, in :func:`pages` order."""
    return [b for path in pages() for b in parse(path)]


def _read_block(block: Block) -> None:
    block_skip = None
    line_skips: list[tuple[str, str]] = []
    for marker in block.markers:
        if m := NOT_COMMANDS.match(marker):
            block.not_commands = m.group(1)
        elif m := SKIP_BLOCK.match(marker):
            block_skip = m.group(1)
        elif m := SKIP_LINES.match(marker):
            line_skips.append((m.group(1), m.group(2)))
        else:
            raise ValueError(f"{block.page}:{block.lineno}: unknown docs-test marker {marker!r}")
    if block.not_commands:
        return
    section = section_of(block.page, block.headings)
    pending: list[tuple[int, str]] = []
    for lineno, text in block.raw:
        if not pending and text.lstrip().startswith("#"):
            continue  # a comment line (continues the previous line's comment)
        pending.append((lineno, text))
        joined = "\n".join(t for _, t in pending)
        if _complete(joined):
            block.commands.append(Command(joined, pending[0][0], block.heading, section, block.page))
            pending = []
    if pending:  # an open quote to the end of the block: not a command (problems() says so)
        block.commands.append(Command("\n".join(t for _, t in pending), pending[0][0], block.heading, section,
                                      block.page))
    for cmd in block.commands:
        if block_skip:
            cmd.skip = block_skip
        for needle, reason in line_skips:
            if needle in cmd.text:
                cmd.skip = reason
    block.unused_line_skips = [n for n, _ in line_skips if not any(n in c.text for c in block.commands)]


def problems(blocks: list[Block]) -> list[str]:
    """What makes a page untestable as written (the static test lists them)."""
    out = []
    commands = [c for b in blocks for c in b.commands]
    runnable_keys = {command_key(c.text) for c in commands if not c.skip and not synopsis_marks(c.text)}
    for b in blocks:
        for needle in b.unused_line_skips:
            out.append(f"{b.page}:{b.lineno}: skip marker {needle!r} matches no line of the block")
        for c in b.commands:
            if not _is_command(c.text):
                out.append(f"{c.where}: {c.first_line!r} is neither a command nor marked 'not commands'")
            if c.skip:
                continue
            if c.section is None:
                out.append(f"{c.where}: block under heading {c.heading!r} belongs to no test section "
                           "(tests/docs/blocks.py SECTIONS) and is not marked skip")
            marks = synopsis_marks(c.text)
            if marks and command_key(c.text) not in runnable_keys:
                out.append(f"{c.where}: synopsis {c.first_line!r} ({', '.join(marks)}) has no concrete "
                           f"runnable example of {command_key(c.text)!r} on any page")
    return out
