"""The home's settings file (<home>/settings.toml) and `python -m infra.settings`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.secrets import scrub
from infra.settings import (
    SettingsFileError,
    get_core_settings,
    get_governance_settings,
    get_kb_settings,
    get_serve_settings,
    settings_file,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home, with no INDUSFLOW_* variable of the calling shell but the home."""
    for name in list(os.environ):
        if name.startswith("INDUSFLOW_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("INDUSFLOW_HOME", str(tmp_path))
    return tmp_path


def write(home: Path, text: str, mode: int = 0o600) -> Path:
    path = home / "settings.toml"
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


def test_the_file_is_read_from_the_home(home: Path) -> None:
    write(home, '[serve]\nport = 8123\n\n[kb]\nmax_upload_files = 7\n\n[governance]\napproval_required = ["fraud-seq"]\n')
    assert settings_file() == home.resolve() / "settings.toml"
    assert get_serve_settings().port == 8123
    assert get_kb_settings().max_upload_files == 7
    assert get_governance_settings().approval_required == ["fraud-seq"]
    assert get_serve_settings().host == "127.0.0.1"  # not in the file: the default


def test_environment_wins_over_the_file(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(home, "[serve]\nport = 8123\n")
    monkeypatch.setenv("INDUSFLOW_SERVE_PORT", "9000")
    assert get_serve_settings().port == 9000


def test_no_file_means_defaults(home: Path) -> None:
    assert get_serve_settings().port == 8000


@pytest.mark.parametrize(("text", "expected"), [
    ("[serve]\nprot = 1\n", "[serve] has no setting 'prot': did you mean 'port'?"),
    ("[sreve]\nport = 1\n", "[sreve] is not a table"),
    ("port = 1\n", "port is set outside a table"),
    ('[serve]\nport = "eighty"\n', "[serve] port: Input should be a valid integer"),
    ("[serve]\nport = 70000\n", "[serve] port: Input should be less than or equal to 65535"),
    ('[core]\nhome = "/elsewhere"\n', "[core] home: the home is where this file lives"),
    ("[serve\n", "cannot read it as TOML"),
])
def test_a_bad_file_names_the_file_table_and_key(home: Path, text: str, expected: str) -> None:
    path = write(home, text)
    with pytest.raises(SettingsFileError) as err:
        get_kb_settings()  # any class: the whole file is checked
    assert str(err.value).startswith(f"{path}: ")
    assert expected in str(err.value)


def test_a_secret_needs_an_owner_only_file(home: Path) -> None:
    secret = "Hs256-Secret-Value-1234567890"
    path = write(home, f'[serve]\njwt_hs256_secret = "{secret}"\n', mode=0o644)
    with pytest.raises(SettingsFileError) as err:
        get_serve_settings()
    message = str(err.value)
    assert "jwt_hs256_secret is a secret" in message and f"chmod 600 {path}" in message
    assert "INDUSFLOW_SERVE_JWT_HS256_SECRET" in message and secret not in message
    with pytest.raises(SettingsFileError):
        get_core_settings()  # every class refuses the file, not only the one that holds the secret
    path.chmod(0o600)
    assert get_serve_settings().jwt_hs256_secret.get_secret_value() == secret


def test_a_wrongly_typed_secret_is_not_echoed(home: Path) -> None:
    write(home, "[serve]\naudit_salt = 12345678901234567890\n")
    with pytest.raises(SettingsFileError) as err:
        get_serve_settings()
    assert "audit_salt" in str(err.value) and "12345678901234567890" not in str(err.value)


def test_a_secret_of_the_file_is_scrubbed_like_one_of_the_environment(home: Path) -> None:
    secret = "Llm-Key-From-The-File-0987654321"
    write(home, f'[llm]\napi_key = "{secret}"\n')
    assert secret not in scrub(f"upstream said: bad key {secret}")


def run_settings(home: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INDUSFLOW_")}
    return subprocess.run([sys.executable, "-m", "infra.settings", *args], cwd=ROOT, capture_output=True, text=True,
                          env={**base, "PYTHONPATH": str(ROOT), "INDUSFLOW_HOME": str(home), **(env or {})},
                          timeout=120, check=False)


def test_the_command_shows_values_sources_and_masks_secrets(tmp_path: Path) -> None:
    secret = "Redis-Password-In-The-File-42"
    write(tmp_path, f'[serve]\nport = 8123\nredis_url = "redis://user:{secret}@cache:6379/0"\n')
    proc = run_settings(tmp_path, env={"INDUSFLOW_SERVE_HOST": "0.0.0.0"})
    assert proc.returncode == 0, proc.stderr
    assert secret not in proc.stdout + proc.stderr
    lines = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[1:]}
    assert lines["INDUSFLOW_SERVE_PORT"] == ["8123", "settings.toml"]
    assert lines["INDUSFLOW_SERVE_HOST"] == ["0.0.0.0", "environment"]
    assert lines["INDUSFLOW_SERVE_REDIS_URL"] == ["**********", "settings.toml"]
    assert lines["INDUSFLOW_SERVE_MAX_ROWS"] == ["1024", "default"]
    proc = run_settings(tmp_path, "--json", "serve")
    rows = {r["variable"]: r for r in json.loads(proc.stdout)}
    assert rows["INDUSFLOW_SERVE_PORT"] == {"variable": "INDUSFLOW_SERVE_PORT", "table": "serve", "key": "port",
                                            "value": "8123", "source": "settings.toml"}
    assert {r["table"] for r in rows.values()} == {"serve"} and secret not in proc.stdout


def test_the_command_reports_a_bad_file_in_one_line(tmp_path: Path) -> None:
    write(tmp_path, "[serve]\nprot = 1\n")
    proc = run_settings(tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve() / 'settings.toml'}: [serve] has no setting 'prot': did you mean 'port'?"]


def test_init_writes_an_owner_only_template_that_reads_as_the_defaults(tmp_path: Path) -> None:
    home = tmp_path / "new-home"
    defaults = {r["variable"]: r["value"] for r in json.loads(run_settings(home, "--json").stdout)}
    proc = run_settings(home, "--init")
    assert proc.returncode == 0, proc.stderr
    path = home / "settings.toml"
    assert path.stat().st_mode & 0o777 == 0o600 and "# [serve]" in path.read_text()
    kept = [line[2:] for line in path.read_text().splitlines()
            if line.startswith("# [") or (line.startswith("# ") and " = " in line and "(unset)" not in line)]
    path.write_text("\n".join(kept))  # every default written out: the file must read back as the defaults
    rows = json.loads(run_settings(home, "--json").stdout)
    assert {r["variable"]: r["value"] for r in rows} == defaults
    from_file = {r["variable"] for r in rows if r["source"] == "settings.toml"}
    assert from_file == {v for v, shown in defaults.items() if shown != "unset"} - {"INDUSFLOW_HOME"}
    assert run_settings(home, "--init").returncode == 2  # never replaces a file


@pytest.mark.parametrize("command", [["flows.serve"], ["flows.registry", "approvals"]])
def test_a_command_reports_a_bad_file_as_its_one_error_line(tmp_path: Path, command: list[str]) -> None:
    """A flow command (flows.registry approvals) printed a traceback before SettingsFileError was an IndusflowError."""
    write(tmp_path, "[serve]\nport = 70000\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("INDUSFLOW_", "PREFECT_API"))}
    proc = subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**base, "PYTHONPATH": str(ROOT), "INDUSFLOW_HOME": str(tmp_path)}, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve() / 'settings.toml'}: [serve] port: Input should be less than or equal to 65535 "
        "(got 70000)"]
