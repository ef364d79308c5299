"""Runs the commands of README.md and docs/ as a user types them, section by section, each in its own home.

A section (:data:`blocks.SECTIONS`) runs in a scratch folder that holds the repository (links), a
``.venv`` that is the installed environment, the files the pages name (:mod:`fixtures`) and
``HOME``: a fresh one (the default ``~/.indusflow`` and ``~/.prefect`` empty) or, for a section that
``needs`` another, a copy of the folder that one left once its commands ran and its servers
stopped (:class:`Pages`). No ``INDUSFLOW_*`` or ``PREFECT_*`` variable of the calling shell is
passed on, and the venv is not on ``PATH`` (the pages spell ``.venv/bin/...``). Each section starts
with that environment (a new terminal); ``export`` lines and the values below carry on to the
section's later lines.

A command fails on a non-zero exit status (curl gets ``--fail-with-body`` from a ``.curlrc``, so
an HTTP 4xx/5xx is one), a traceback, a WARNING/ERROR/CRITICAL log line, a ``warning:``/``error:``
line or a Python warning in its output. Servers a page starts in a terminal of their own
run in the background until the end of their section, then get Ctrl-C (SIGINT); their output
is checked the same way (only ``AT_CTRL_C``, Prefect's queue drain after Ctrl-C, is reported as
a note instead).

Where a line is not run exactly as written, the change is one of the fixed lists below, and
the report says which, for every line:
``SUBSTITUTIONS`` (ports: two servers on fixed ports would collide with anything else on the
machine), ``CAPTURES`` (``$KEY`` and friends, filled from an earlier command's output as the
user copies them), ``POLLS`` (a status the user re-checks until it settles).
Run it alone: ``.venv/bin/python -m tests.docs.harness [SECTION ...]`` (from the repository root).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from tests.docs import blocks as rb
    from tests.docs import fixtures as page_fixtures
except ImportError:  # run as a file
    sys.path.insert(0, str(Path(__file__).parent))
    import blocks as rb  # type: ignore[no-redef]
    import fixtures as page_fixtures  # type: ignore[no-redef]

ROOT = rb.ROOT
COMMAND_TIMEOUT_S = 1200

#: Sections side by side (the docs tier's pytest-xdist workers): every process of a command runs one
#: torch/OpenMP thread, on any core. A worker pinned to one core (tests/conftest.py) kept a section's
#: command and its temporary Prefect server on that core, and the fraud guide's chain ran its last
#: minutes beside an idle core; unpinned with the project's default threads, two trainings ran four
#: threads on two cores (a default fraud training 413 s instead of 55 s, 2026-12-07). Alone (one
#: section, or DOCS_WORKERS=0) a command runs as in a new terminal: the project's own thread choice.
SIDE_BY_SIDE_THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "INDUSFLOW_TRAIN_NUM_THREADS": "1"}
TAIL_LINES = 25
#: A section's report (commands, seconds, CPU seconds) beside the folder it left (``pages/NAME/``).
REPORT = "report.txt"


def side_by_side() -> bool:
    """Whether this process is one of several docs-tier workers (see :data:`SIDE_BY_SIDE_THREADS`)."""
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1


#: (text on a page, what runs instead, why). Applied to every line that holds the text.
SUBSTITUTIONS: list[tuple[str, str, str]] = [
    ("localhost:8000", "localhost:{serve_port}",
     "the API listens on a free port (INDUSFLOW_SERVE_PORT={serve_port}), not 8000"),
    ("127.0.0.1:4200", "127.0.0.1:{ui_port}",
     "the Prefect server listens on a free port (PORT={ui_port} for make ui), not 4200"),
]


def _last_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


def _key_id(out: str) -> str:
    m = re.search(r"^API key (\S+) \(", out, re.MULTILINE)
    return m.group(1) if m else ""


def _json_field(name: str) -> Callable[[str], str]:
    def get(out: str) -> str:
        try:
            return str(json.loads(out)[name])
        except (ValueError, KeyError, TypeError):
            return ""
    return get


def _public_key(out: str) -> str:
    """The public key ``python -m flows.registry keygen`` prints to enrol."""
    m = re.search(r"^enrol this public key: [^:]+:(\S+)$", out, re.MULTILINE)
    return m.group(1) if m else ""


def _first_run_id(out: str) -> str:
    m = re.search(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\s.*\bwaiting\b", out, re.MULTILINE)
    return m.group(1) if m else ""


#: (regex on the page's line, {variable: how to read it from the command's stdout}).
CAPTURES: list[tuple[str, dict[str, Callable[[str], str]]]] = [
    (r'keys add "card-auth"', {"KEY": _last_line, "KEY_ID": _key_id}),
    (r'keys add "ops"', {"OPS_KEY": _last_line}),
    (r'keys add "legal team"', {"KEY": _last_line}),
    (r'keys add "kb-team"', {"KEY": _last_line}),
    (r"-F files=@lease\.pdf", {"JOB_ID": _json_field("job_id")}),
    (r"-m flows\.\w+ approvals\b", {"RUN": _first_run_id}),
    (r"registry keygen alice\b", {"ALICE_PUB": _public_key}),
    (r"registry keygen bob\b", {"BOB_PUB": _public_key}),
]


def _job_settled(rc: int, out: str) -> tuple[bool, str | None]:
    if rc != 0:
        return True, None
    try:
        state = json.loads(out).get("state")
    except ValueError:
        return True, "the answer is not JSON"
    if state in ("done", "failed"):
        return True, "the ingest job failed" if state == "failed" else None
    return False, None


def _answers_2xx(rc: int, out: str) -> tuple[bool, str | None]:
    return rc == 0, None  # curl --fail-with-body: 22 on a 4xx/5xx (503 while the champions load)


#: (regex on the page's line, settled(rc, stdout) -> (settled, problem), seconds at most).
POLLS: list[tuple[str, Callable[[int, str], tuple[bool, str | None]], float]] = [
    (r"/v1/kb/jobs/\$JOB_ID", _job_settled, 900.0),
    (r"curl -s localhost:8000/readyz", _answers_2xx, 180.0),  # "ready once the champions are loaded"
]


@dataclass(frozen=True)
class Background:
    """A command that runs until stopped (its own terminal, Ctrl-C)."""

    pattern: str
    ready: str  #: "http:URL" (answers 2xx) or "log:TEXT" (printed)
    #: a job that waits in its terminal for a later command (an approval) and then ends by
    #: itself: at the section's end it must have ended with status 0 (no Ctrl-C)
    ends: bool = False


BACKGROUND: list[Background] = [
    Background(r"\.venv/bin/python -m flows\.serve\s*(#|$)", "http:http://127.0.0.1:{serve_port}/healthz"),
    Background(r"^make ui\b", "http:http://127.0.0.1:{ui_port}/api/health"),
    Background(r"prefect worker start\b", "log:started!"),
    Background(r"APPROVAL_REQUIRED=\S+ \.venv/bin/python -m flows\.\w+ (promote|train)\b", "log:waits for approval",
               ends=True),
    Background(r"-m flows\.registry challenger \S+:\d+ ", "log:waits for approval", ends=True),
]
ENDS_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 300.0

NOISE = [
    (re.compile(r"Traceback \(most recent call last\)"), "a traceback"),
    (re.compile(r"\|\s*(WARNING|ERROR|CRITICAL)\s*\|"), "a WARNING/ERROR log line"),
    (re.compile(r"^\s*(WARNING|ERROR|CRITICAL)\b[:\s]", re.MULTILINE), "a WARNING/ERROR log line"),
    (re.compile(r"^\s*(warning|error):", re.MULTILINE | re.IGNORECASE), "a warning/error line"),
    (re.compile(r"\b[A-Z]\w*Warning: "), "a Python warning"),
]


#: (pattern, why): upstream messages a background server may print *after* it got Ctrl-C, reported
#: in its notes instead of failing it. Only Prefect's own service drain is listed: at Ctrl-C its
#: event/log workers flush their queues and warn while items remain (prefect
#: ``_internal/concurrency/services.py``), which nothing the user types can change.
AT_CTRL_C: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\|\s*WARNING\s*\|.*Still processing items: \d+ items remaining"),
     "Prefect's event/log workers flushing their queues at Ctrl-C"),
]


def noise_lines(text: str) -> list[str]:
    """Lines of output a documented command must not print (first of each kind)."""
    found = []
    for line in text.splitlines():
        for pattern, kind in NOISE:
            if pattern.search(line):
                found.append(f"{kind}: {line.strip()[:300]}")
                break
    return found


@dataclass
class Outcome:
    cmd: rb.Command
    status: str  #: ok, FAILED, skipped
    ran: str = ""
    notes: list[str] = field(default_factory=list)  #: substitutions, captures, polls
    rc: int | None = None
    seconds: float = 0.0
    cpu_s: float = 0.0  #: CPU seconds of its processes (those that ended: a command waits for what it starts)
    stdout: str = ""
    stderr: str = ""
    problems: list[str] = field(default_factory=list)
    reason: str = ""  #: why skipped

    def tail(self) -> str:
        text = (self.stdout.rstrip() + "\n" + self.stderr.rstrip()).strip()
        return "\n".join(text.splitlines()[-TAIL_LINES:])


@dataclass
class SectionResult:
    name: str
    outcomes: list[Outcome]
    seconds: float
    start: str = "a fresh home"  #: where its home came from

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "FAILED"]

    def report(self) -> str:
        ran = [o for o in self.outcomes if o.status != "skipped"]
        out = [(f"docs section {self.name}: {len(ran)} commands run, {len(self.failed)} failed, "
               f"{len(self.outcomes) - len(ran)} skipped, {self.seconds:.0f} s; {self.start}")]
        for o in self.outcomes:
            head = f"  [{o.status}] {o.cmd.where}: {o.cmd.first_line.strip()[:110]}"
            if o.status == "skipped":
                out.append(f"{head}\n      skipped: {o.reason}")
                continue
            out.append(f"{head}  ({o.seconds:.0f} s, {o.cpu_s:.0f} CPU-s, rc {o.rc})")
            out += [f"      {n}" for n in o.notes]
            out += [f"      problem: {p}" for p in o.problems]
        return "\n".join(out)

    def failure_message(self) -> str:
        parts = [f"docs section {self.name}: {len(self.failed)} command(s) failed"]
        for o in self.failed:
            parts.append(f"\n--- {o.cmd.where}: {o.ran.strip()}\n" + "\n".join(
                f"    {p}" for p in o.problems) + f"\n  output tail:\n{o.tail()}")
        return "\n".join(parts)


def _default_sigint() -> None:
    """Children get Ctrl-C as in a terminal even when this runs where SIGINT is ignored (``cmd &``):
    an ignored signal stays ignored across exec, and bash cannot un-ignore it."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _venv() -> Path:
    if sys.prefix == sys.base_prefix:
        raise RuntimeError("the docs test runs in the project's virtual environment (.venv/bin/python -m pytest)")
    return Path(sys.prefix)


def make_fresh(root: Path) -> None:
    """A fresh page folder at ``root``: the fixtures, the repository's entries as links, a ``.venv``
    that is the installed one, an empty home (with its ``.curlrc``)."""
    cwd, home = root / "work", root / "home"
    cwd.mkdir(parents=True)
    home.mkdir()
    page_fixtures.write_all(cwd)
    for entry in ROOT.iterdir():
        if entry.name not in (".venv", ".git") and not (cwd / entry.name).exists():
            (cwd / entry.name).symlink_to(entry)
    venv = cwd / ".venv"  # the installed venv, entry by entry, with its own install stamp
    venv.mkdir()
    for entry in _venv().iterdir():
        if entry.name != ".installed":
            (venv / entry.name).symlink_to(entry)
    (venv / ".installed").touch()  # make ui's `install` prerequisite is met: no pip run
    (home / ".curlrc").write_text(
        "fail-with-body\nshow-error\nwrite-out = \"%{stderr}[curl] HTTP %{http_code}\\n\"\n")


class Pages:
    """Every section's home in one folder (``base``), each section run once.

    ``fresh/`` is the fresh page folder (:func:`make_fresh`, made once); ``pages/NAME/`` is the
    folder section NAME left, servers stopped: its snapshot, copied for the sections that need it;
    ``run/`` is where the section now running works. Every section runs at that same path, so a
    copy is valid as it is: the absolute paths tools write into a home (Prefect's database and
    cached task results, Lightning's checkpoints, the batch ledgers, RocksDB's files) name the
    running copy, never the section it came from.
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.run_dir = base / "run"
        if side_by_side() and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the commands on any core: SIDE_BY_SIDE_THREADS
        self.blocks = rb.parse_all()
        self.done: dict[str, SectionResult] = {}
        _default_sigint()

    def result(self, name: str) -> SectionResult:
        """Section ``name``'s result, running it (after the sections it needs) the first time."""
        if name not in self.done:
            self.done[name] = self.run(name)
        return self.done[name]

    def snapshot(self, name: str) -> Path:
        """The folder section ``name`` left (an earlier run's under the same ``base`` counts)."""
        path = self.base / "pages" / name
        if not path.exists():
            self.result(name)
        return path

    def fresh(self) -> Path:
        path = self.base / "fresh"
        if not path.exists():
            make_fresh(path)
        return path

    def run(self, name: str) -> SectionResult:
        """Runs section ``name`` in a copy of the home it needs; keeps what it left as ``pages/NAME``."""
        needs = rb.BY_NAME[name].needs
        source = self.snapshot(needs) if needs else self.fresh()
        start = time.monotonic()
        if self.run_dir.exists():
            shutil.rmtree(self.run_dir)
        shutil.copytree(source, self.run_dir, symlinks=True, ignore=_left_by_the_run(source))
        copied = time.monotonic() - start
        result = Workspace(self.run_dir, self.blocks).run_section(name)
        result.seconds += copied
        result.start = (f"home: a copy of {needs}'s ({copied:.0f} s)" if needs else "a fresh home") + (
            f" ({needs} FAILED)" if needs and self.done.get(needs) and self.done[needs].failed else "")
        kept = self.base / "pages" / name
        if kept.exists():
            shutil.rmtree(kept)
        kept.parent.mkdir(exist_ok=True)
        self.run_dir.rename(kept)
        (kept / REPORT).write_text(result.report() + "\n")  # a worker's output is not shown: read it here
        return result


def _left_by_the_run(source: Path) -> Callable[[str, list[str]], list[str]]:
    """Not copied: the earlier section's report, server logs and environment dump (beside its work and home)."""
    def ignore(folder: str, names: list[str]) -> list[str]:
        if Path(folder) != source:
            return []
        return [n for n in names if n in ("env.out", REPORT) or (n.startswith("server-") and n.endswith(".log"))]
    return ignore


class Workspace:
    """The folder one section's commands run in, its home, its ports and the servers it started."""

    def __init__(self, root: Path, blocks: list[rb.Block] | None = None) -> None:
        self.root = root
        self.cwd = root / "work"
        self.home = root / "home"
        self.blocks = blocks if blocks is not None else rb.parse_all()
        _default_sigint()
        self.ports = {"serve_port": free_port(), "ui_port": free_port()}

    def base_env(self) -> dict[str, str]:
        venv_bin = str(_venv() / "bin")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("INDUSFLOW_", "PREFECT_", "PYTEST_", "VIRTUAL_ENV", "CURL_HOME"))}
        env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
        env["HOME"] = str(self.home)
        env["CURL_HOME"] = str(self.home)  # its .curlrc: --fail-with-body, the HTTP status on stderr
        env["PYTHONPATH"] = str(ROOT)  # this checkout's code, whichever checkout the venv installed
        env["INDUSFLOW_SERVE_PORT"] = str(self.ports["serve_port"])
        env["PORT"] = str(self.ports["ui_port"])
        env.pop("PYTHONWARNINGS", None)
        # the pages' `prefect deploy --all` registers cron schedules; a run they fire depends on the clock,
        # not on the page (02:00 UTC: nightly-retrain ran on a docs home with one day accumulated and the
        # section failed, 2026-12-07). Cron runs firing on a worker: tests/servers/test_team_prefect_server.py
        env["PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED"] = "false"
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # the test session's one thread (tests/conftest.py)
            env.pop(name, None)
        if side_by_side():
            env.update(SIDE_BY_SIDE_THREADS)
        return env

    def commands(self, section: str) -> list[rb.Command]:
        return [c for b in self.blocks for c in b.commands if c.section == section]

    def run_section(self, section: str) -> SectionResult:
        start = time.monotonic()
        env = self.base_env()
        servers: list[tuple[Outcome, subprocess.Popen, Path, bool]] = []
        outcomes: list[Outcome] = []
        runnable = {rb.command_key(c.text): c for b in self.blocks for c in b.commands
                    if not c.skip and not rb.synopsis_marks(c.text)}
        try:
            for cmd in self.commands(section):
                if cmd.skip:
                    outcomes.append(Outcome(cmd, "skipped", reason=cmd.skip))
                    continue
                marks = rb.synopsis_marks(cmd.text)
                if marks:
                    example = runnable.get(rb.command_key(cmd.text))
                    where = f"its concrete example runs at {example.where}" if example else "NO example"
                    outcomes.append(Outcome(cmd, "skipped", reason=f"synopsis ({', '.join(marks)}); {where}"))
                    continue
                bg = next((b for b in BACKGROUND if re.search(b.pattern, cmd.text)), None)
                if bg:
                    outcome, proc, log = self._start(cmd, bg, env)
                    outcomes.append(outcome)
                    if proc is not None:
                        servers.append((outcome, proc, log, bg.ends))
                else:
                    outcomes.append(self._run(cmd, env))
                self._print_progress(section, outcomes[-1])
        finally:
            for outcome, proc, log, ends in reversed(servers):
                self._stop(outcome, proc, log, ends)
        return SectionResult(section, outcomes, time.monotonic() - start)

    @staticmethod
    def _print_progress(section: str, o: Outcome) -> None:
        if os.environ.get("DOCS_TEST_VERBOSE"):
            print(f"[{section}] {o.status} {o.cmd.where} ({o.seconds:.0f} s, {o.cpu_s:.0f} CPU-s): {o.cmd.first_line[:90]}"
                  + "".join(f"\n    {p[:200]}" for p in o.problems[:3]), file=sys.__stderr__, flush=True)

    def _prepare(self, cmd: rb.Command) -> tuple[str, list[str]]:
        text, notes = cmd.text, []
        for old, new, why in SUBSTITUTIONS:
            if old in text:
                new = new.format(**self.ports)
                text = text.replace(old, new)
                notes.append(f"substituted {old!r} -> {new!r}: {why.format(**self.ports)}")
        for var in sorted(set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", text))):
            notes.append(f"${var} from an earlier command's output (see CAPTURES)")
        return text, notes

    def _run(self, cmd: rb.Command, env: dict[str, str]) -> Outcome:
        text, notes = self._prepare(cmd)
        poll = next((p for p in POLLS if re.search(p[0], cmd.text)), None)
        envfile = self.root / "env.out"
        script = f"{text}\n__docs_rc=$?\nenv -0 > {envfile}\nexit $__docs_rc\n"
        outcome = Outcome(cmd, "ok", ran=text, notes=notes)
        start, cpu = time.monotonic(), _children_cpu_s()
        deadline = start + (poll[2] if poll else 0)
        tries = 0
        while True:
            tries += 1
            rc, outcome.stdout, outcome.stderr = _run_in_own_group(script, self.cwd, env)
            if rc is None:
                outcome.problems.append(f"still running after {COMMAND_TIMEOUT_S} s (its process group killed)")
                break
            outcome.rc = rc
            if not poll:
                break
            settled, problem = poll[1](outcome.rc, outcome.stdout)
            if settled or time.monotonic() > deadline:
                if problem:
                    outcome.problems.append(problem)
                if not settled:
                    outcome.problems.append(f"not settled after {poll[2]:.0f} s")
                if tries > 1:
                    outcome.notes.append(f"re-run {tries} times until it settled (see POLLS)")
                break
            time.sleep(3)
        outcome.seconds, outcome.cpu_s = time.monotonic() - start, _children_cpu_s() - cpu
        if outcome.rc not in (0, None):
            outcome.problems.insert(0, f"exit status {outcome.rc}")
        outcome.problems += noise_lines(outcome.stdout + "\n" + outcome.stderr)
        if outcome.rc == 0 and envfile.exists():
            for item in envfile.read_text().split("\0"):
                key, sep, value = item.partition("=")
                if sep and key not in ("_", "SHLVL", "PWD", "OLDPWD") and not key.startswith("__docs"):
                    env[key] = value
        for pattern, fields in CAPTURES:
            if re.search(pattern, cmd.text):
                for var, read in fields.items():
                    value = read(outcome.stdout)
                    if value:
                        env[var] = value
                        outcome.notes.append(f"${var} filled from its output (see CAPTURES)")
                    else:
                        outcome.problems.append(f"could not read ${var} from its output")
        if outcome.problems:
            outcome.status = "FAILED"
        return outcome

    def _start(self, cmd: rb.Command, bg: Background, env: dict[str, str]) -> tuple[Outcome, subprocess.Popen | None, Path]:
        text, notes = self._prepare(cmd)
        notes.append("runs in its own terminal; ends by itself once a later command lets it" if bg.ends else
                     "runs in the background (its own terminal) until the end of the section, then Ctrl-C")
        log = self.root / f"server-{cmd.lineno}.log"
        outcome = Outcome(cmd, "ok", ran=text, notes=notes)
        start = time.monotonic()
        with open(log, "w") as fh:
            proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", text], cwd=self.cwd, env=dict(env),
                                    stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        kind, _, target = bg.ready.format(**self.ports).partition(":")
        while True:
            if proc.poll() is not None:
                outcome.rc = proc.returncode
                outcome.problems.append(f"exited (status {proc.returncode}) before it was ready")
                break
            if (kind == "http" and _answers(target)) or (kind == "log" and target in log.read_text(errors="replace")):
                break
            if time.monotonic() - start > READY_TIMEOUT_S:
                outcome.problems.append(f"not ready after {READY_TIMEOUT_S:.0f} s ({bg.ready})")
                break
            time.sleep(1)
        outcome.seconds = time.monotonic() - start
        outcome.notes.append(f"ready after {outcome.seconds:.0f} s")
        if outcome.problems:
            outcome.status = "FAILED"
            self._stop(outcome, proc, log)
            return outcome, None, log
        return outcome, proc, log

    @staticmethod
    def _stop(outcome: Outcome, proc: subprocess.Popen, log: Path, ends: bool = False) -> None:
        cpu = _children_cpu_s()  # it is reaped below: its whole life counts
        if ends:
            try:
                proc.wait(ENDS_TIMEOUT_S)
                if proc.returncode != 0:
                    outcome.problems.append(f"exit status {proc.returncode}")
            except subprocess.TimeoutExpired:
                outcome.problems.append(f"still waiting {ENDS_TIMEOUT_S:.0f} s after the section's last command")
        elif proc.poll() is not None and not outcome.problems:
            outcome.problems.append(f"stopped by itself during the section (status {proc.returncode})")
        before_ctrl_c = len(log.read_text(errors="replace"))
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait)
            except subprocess.TimeoutExpired:
                if sig == signal.SIGINT:
                    outcome.problems.append("Ctrl-C did not stop it within 60 s")
        if outcome.rc is None:
            outcome.rc = proc.returncode
        outcome.cpu_s += _children_cpu_s() - cpu
        outcome.stdout = log.read_text(errors="replace")
        outcome.problems += noise_lines(outcome.stdout[:before_ctrl_c])
        for line in outcome.stdout[before_ctrl_c:].splitlines():
            why = next((why for pattern, why in AT_CTRL_C if pattern.search(line)), None)
            if why:
                outcome.notes.append(f"after Ctrl-C, not counted ({why}): {line.strip()[:200]}")
            else:
                outcome.problems += noise_lines(line)
        outcome.status = "FAILED" if outcome.problems else outcome.status


def _run_in_own_group(script: str, cwd: Path, env: dict[str, str]) -> tuple[int | None, str, str]:
    """(status, stdout, stderr) of ``bash -c script``; status None when it outran COMMAND_TIMEOUT_S: then
    its whole process group is killed, so no command it started goes on writing into the next
    section's copy of the folder."""
    proc = subprocess.Popen(["bash", "--noprofile", "--norc", "-c", script], cwd=cwd, env=env, text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT_S)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children so far (and of what they waited for)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError):
        return False


def main(argv: list[str]) -> int:
    """``[--workspace DIR] [SECTION ...]``: runs SECTIONs (default: all) and the sections they need.

    With --workspace DIR, the folder an earlier run printed: a needed section whose home it holds
    (``DIR/pages/NAME``) is not run again, and each SECTION runs again from there."""
    base = None
    if argv[:1] == ["--workspace"]:
        base, argv = Path(argv[1]), argv[2:]
    sections = argv or rb.SECTION_NAMES
    problems = rb.problems(rb.parse_all())
    for p in problems:
        print(f"docs problem: {p}")
    pages = Pages(base or Path(tempfile.mkdtemp(prefix="docs-test-")))
    print(f"workspace {pages.base}", flush=True)
    os.environ.setdefault("DOCS_TEST_VERBOSE", "1")
    failed = 0
    for name in sections:
        result = pages.run(name) if base else pages.result(name)
        print(result.report(), flush=True)
        if result.failed:
            failed += 1
            print(result.failure_message(), flush=True)
    return 1 if failed or problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
