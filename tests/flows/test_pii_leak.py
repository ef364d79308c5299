"""Nothing personal leaves the redaction boundary: ingest a folder whose file names, archive member
names, mail subjects and texts carry personal data, ask a question carrying more against an LLM
that echoes everything it receives, then look for every value in the Milvus file, the whole home,
the Prefect database and everything printed."""

from __future__ import annotations

import email.message
import io
import json
import threading
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("milvus_lite")
pytest.importorskip("iscc_tika")

# values as written in the inputs (a value in several forms is listed in each)
ID_GLUED = "440304198507153218"  # after "RecordID"
ID_SPACED = "110105 19491231 002X"
ID_FULLWIDTH = "３１０１１５１９９００３０７１２３９"
MOBILE_NAME = "13712345678"
MOBILE_DOTTED = "139.1234.5678"
MOBILE_PLUS = "+86 158 1111 2222"
MOBILE_QUESTION = "18600001234"
CARD_SPACED = "4111 1111 1111 1111"
CARD_SUBJECT = "6217001234567890122"
EMAIL_NAME = "carol@example.net"
EMAIL_TEXT = "wang.fang@corp.example.cn"
EMAIL_QUESTION = "li.lei@mail.example.org"
QUARANTINED_MARKER = "zebraquartzmarker"  # only in an attachment that is quarantined
ATTACHMENT_MARKER = "pelicanattachmentmarker"  # only in an attachment that is indexed


def _forms(value: str) -> set[str]:
    """The value as written and as bare ASCII digits/characters (what a partial redaction leaves)."""
    ascii_value = value.translate(str.maketrans("０１２３４５６７８９", "0123456789"))
    bare = "".join(ch for ch in ascii_value if ch.isalnum() or ch in "@.")
    forms = {value, ascii_value, bare, bare.removeprefix("86") if value.startswith("+86") else bare}
    return {f for f in forms if len(f) >= 8}


PII = [ID_GLUED, ID_SPACED, ID_FULLWIDTH, MOBILE_NAME, MOBILE_DOTTED, MOBILE_PLUS, MOBILE_QUESTION, CARD_SPACED,
       CARD_SUBJECT, EMAIL_NAME, EMAIL_TEXT, EMAIL_QUESTION]


def _corpus(root: Path) -> None:
    root.mkdir()
    (root / f"客户_{MOBILE_NAME}_{EMAIL_NAME}.txt").write_text(
        f"退款说明：客户联系电话 {MOBILE_DOTTED}，身份证 {ID_SPACED}，退款到银行卡 {CARD_SPACED}。", encoding="utf-8")
    folder = root / f"档案_{ID_SPACED.replace(' ', '')}"
    folder.mkdir()
    (folder / "notes.txt").write_text(f"证件号码：{ID_FULLWIDTH}。邮箱 {EMAIL_TEXT}，手机 {MOBILE_PLUS}。", encoding="utf-8")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"RecordID{ID_GLUED}.txt", f"refund record for RecordID{ID_GLUED}, call {MOBILE_NAME}.")
        z.writestr(f"会员_{MOBILE_DOTTED}.txt", "会员积分说明：退款在七个工作日内到账，积分在退款完成后同步扣除，"
                   "如有疑问请联系客服中心。Refunds reach the card within seven working days.")
    (root / "records.zip").write_bytes(buf.getvalue())

    msg = email.message.EmailMessage()
    msg["From"] = EMAIL_TEXT
    msg["To"] = "support@example.com"
    msg["Subject"] = f"退款 {CARD_SUBJECT} 客户 {MOBILE_PLUS}"
    msg.set_content(f"请处理卡号 {CARD_SUBJECT} 的退款，客户邮箱 {EMAIL_NAME}。")
    msg.add_attachment(f"The {ATTACHMENT_MARKER} form lists {MOBILE_DOTTED}.".encode(), maintype="text",
                       subtype="plain", filename=f"表单_{MOBILE_NAME}.txt")
    msg.add_attachment(f"secret {QUARANTINED_MARKER} {ID_GLUED}".encode(), maintype="text", subtype="plain",
                       filename=f"../escape_{MOBILE_NAME}.txt")
    (root / "mail.eml").write_bytes(msg.as_bytes())

    mbox = (f"From someone@example.com Mon Jan  1 00:00:00 2024\nFrom: {EMAIL_TEXT}\n"
            f"Subject: 投诉 {MOBILE_DOTTED} {EMAIL_NAME}\n\n客户投诉退款太慢，身份证 {ID_SPACED}。\n")
    (root / "box.mbox").write_text(mbox, encoding="utf-8")


class _EchoChat(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint whose answer is everything it received (headers and body)."""

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers["Content-Length"])).decode()
        echo = f"[1] headers={dict(self.headers)} body={raw}"
        if json.loads(raw).get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(0, len(echo), 7):
                chunk = {"choices": [{"index": 0, "delta": {"content": echo[i : i + 7]}}]}
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            return
        body = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": echo}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def echo_llm() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _hits(folder: Path, needles: dict[str, bytes]) -> list[str]:
    found = []
    for path in [folder] if folder.is_file() else folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{label} in {path}" for label, needle in needles.items() if needle in data]
    return found


def test_nothing_personal_leaks(tmp_path: Path, monkeypatch, capfd, echo_llm: str) -> None:
    import flows.rag.ingest as ingest_flow
    from flows.rag import answer, steps
    from flows.rag.cli import main
    from infra.milvus import lite_path, open_client
    from tests.integration._hash_embedder import HashEmbedder

    home = tmp_path / "home"
    monkeypatch.setenv("INDUSFLOW_HOME", str(home))
    monkeypatch.delenv("INDUSFLOW_MILVUS_URI", raising=False)  # the Milvus Lite file under the home
    monkeypatch.setenv("INDUSFLOW_LLM_URL", echo_llm)
    monkeypatch.setenv("INDUSFLOW_LLM_MODEL", "echo")
    monkeypatch.setenv("INDUSFLOW_LLM_API_KEY", "sk-echo-test-key-0000000000")
    embedder = HashEmbedder()
    monkeypatch.setattr(ingest_flow, "embedder_from_settings", lambda *a, **k: embedder)
    monkeypatch.setattr(steps, "embedder_from_settings", lambda *a, **k: embedder)
    monkeypatch.setattr(answer, "embedder_from_settings", lambda *a, **k: embedder)  # `ask` without a Prefect API
    corpus = tmp_path / "kb"
    _corpus(corpus)

    assert main(["ingest", str(corpus), "--collection", "leak", "--chunk-tokens", "64", "--chunk-overlap", "8",
                 "--json"]) == 0
    ingest = json.loads(capfd.readouterr().out.strip().splitlines()[-1])
    assert ingest["parsed"] >= 7 and ingest["redactions"], ingest
    assert [q["reason"] for q in ingest["quarantined"]] == ["unsafe_path"]
    question = (f"客户 {MOBILE_QUESTION}（身份证 {ID_GLUED}，邮箱 {EMAIL_QUESTION}，卡 {CARD_SUBJECT}）"
                "的退款什么时候到账？")
    printed = []
    for stream in ([], ["--stream"]):
        assert main(["ask", question, "--collection", "leak", "--json", *stream]) == 0
        out, err = capfd.readouterr()
        printed.append(out + err)
        ask = json.loads(out.strip().splitlines()[-1])
        assert ask["answer_kind"] == "llm" and "[MOBILE]" in ask["question"] and "body=" in ask["answer"]

    from prefect.settings import PREFECT_HOME, PREFECT_SERVER_DATABASE_CONNECTION_URL

    from infra.prefect_env import settle_prefect

    settle_prefect()
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)  # the runs' logs are in the database before it is searched
    # the e-mail's attachment is indexed once; the quarantined one never
    client = open_client(uri=str(lite_path()))
    texts = [r["text"] for r in client.query("leak", filter="", output_fields=["text"], limit=1000)]
    assert sum(t.count(ATTACHMENT_MARKER) for t in texts) == 1
    assert not any(QUARANTINED_MARKER in t for t in texts)

    needles = {f"{value!r} as {form!r}": form.encode() for value in PII for form in _forms(value)}
    database = Path(PREFECT_SERVER_DATABASE_CONNECTION_URL.value().split("///", 1)[1]).parent
    leaks = _hits(lite_path(), needles) + _hits(home, needles) + _hits(database, needles)
    prefect_home = Path(PREFECT_HOME.value())
    if prefect_home.is_dir():
        leaks += _hits(prefect_home, needles)
    for text in printed:
        leaks += [f"{label} printed" for label, needle in needles.items() if needle.decode() in text]
    assert not leaks, leaks
