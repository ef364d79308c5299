"""The KB ingest under hostile uploads (issue 46): the ingest child gets only the environment it
needs, the job queue is bounded, a job has a time limit, and a file that stopped an ingest is
quarantined and not ingested again until it changes."""

from __future__ import annotations

from pathlib import Path

from infra.home import HomeLayout
from infra.settings import KbSettings


def _engine(home: HomeLayout, **settings):
    from flows.serve.kb_engine import KbEngine
    from solutions.rag.collections import kb_collection

    col = kb_collection("legal", home)
    return KbEngine({"legal": col}, home, KbSettings(collections="legal", **settings), client=object(),
                    embedder=None), col


def test_the_ingest_child_gets_no_serving_secret_and_no_llm_key(tmp_path: Path, monkeypatch) -> None:
    secrets = {"INDUSFLOW_SERVE_JWT_HS256_SECRET": "jwt-secret-value-1", "INDUSFLOW_LLM_API_KEY": "llm-key-value-2",
               "INDUSFLOW_SERVE_AUDIT_SALT": "audit-salt-value-3", "INDUSFLOW_SERVE_REDIS_URL": "redis://:pw-4@r:6379",
               "OPENAI_API_KEY": "sk-shell-key-5", "AWS_SECRET_ACCESS_KEY": "aws-secret-6", "HF_TOKEN": "hf-token-7",
               "GITHUB_TOKEN": "ghp-token-8", "INDUSFLOW_TUNE_STORAGE_URL": "postgresql://u:pw-9@db/optuna"}
    needed = {"INDUSFLOW_EMBED_API_KEY": "embed-key", "INDUSFLOW_MILVUS_URI": "http://milvus:19530",
              "INDUSFLOW_MILVUS_TOKEN": "root:Milvus", "INDUSFLOW_TIKA_SERVER_URL": "http://tika:9998",
              "INDUSFLOW_KB_COLLECTIONS": "legal", "PREFECT_API_URL": "http://prefect:4200/api",
              "PYTHONPATH": "/src", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "2"}
    for name, value in {**secrets, **needed}.items():
        monkeypatch.setenv(name, value)
    engine, _ = _engine(HomeLayout(tmp_path / "home"))
    env = engine.child_env()
    assert not set(secrets) & set(env), sorted(set(secrets) & set(env))  # main's code passed them all
    assert not any(v in "\n".join(env.values()) for v in secrets.values())
    assert {k: env.get(k) for k in needed} == needed
    assert env["INDUSFLOW_HOME"] == str(tmp_path / "home") and "PATH" in env
