// The knowledge-base page: sign in with a key, pick a collection, ask (the answer streams in
// over POST + server-sent events), read the cited passages, upload documents and follow their
// indexing. Every text that comes from the server goes into the page through textContent:
// passages and file names are untrusted.
"use strict";
(() => {
  const KEY_STORE = "indusflow.kb.key";
  const COLLECTION_STORE = "indusflow.kb.collection";
  const POLL_MS = 1000;
  const STATUSES = new Set(["indexed", "pending", "quarantined", "queued", "running", "done", "failed"]);

  const $ = (id) => document.getElementById(id);
  const state = {
    key: sessionStorage.getItem(KEY_STORE),
    collections: [],
    current: null,
    citations: new Map(),
    answer: "",
    askAbort: null,
    jobTimer: null,
    docsTimer: null,
  };

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props || {})) {
      if (name === "text") node.textContent = value;
      else if (name === "class") node.className = value;
      else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child);
    }
    return node;
  }

  function showAlert(message, kind = "error") {
    const box = $("alert");
    box.textContent = message;
    box.className = `alert ${kind}`;
    box.hidden = false;
  }

  function clearAlert() {
    $("alert").hidden = true;
  }

  function authHeaders() {
    // an indusflow key goes in X-API-Key; anything else is taken for a JWT bearer token
    return state.key && state.key.startsWith("ifk_")
      ? { "X-API-Key": state.key }
      : { Authorization: `Bearer ${state.key}` };
  }

  async function errorMessage(resp, what) {
    let detail = "";
    try {
      const body = await resp.json();
      const d = body.detail ?? body.message;
      detail = typeof d === "string" ? d : d ? JSON.stringify(d) : "";
    } catch (_) {
      detail = "";
    }
    switch (resp.status) {
      case 401:
        return "Your key was not accepted (401): it is wrong, expired or revoked. Sign in again with a valid key.";
      case 403:
        return `This key is not allowed to ${what} (403).${detail ? " " + detail : ""}`;
      case 429: {
        const wait = resp.headers.get("Retry-After");
        return `Too many requests (429): the rate limit of this key is reached. Try again${wait ? ` in ${wait} s` : " in a moment"}.`;
      }
      case 404:
        return `Not found (404) while trying to ${what}.${detail ? " " + detail : ""}`;
      case 413:
        return `Too large (413): ${detail || "the request is over the server's size limit"}.`;
      default:
        return `Could not ${what} (${resp.status}${detail ? ": " + detail : ""}).`;
    }
  }

  async function api(path, options, what) {
    let resp;
    try {
      resp = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
    } catch (exc) {
      if (exc.name === "AbortError") throw exc;
      throw new ApiError(0, `Could not reach the server to ${what} (${exc.message}).`);
    }
    if (!resp.ok) {
      const message = await errorMessage(resp, what);
      if (resp.status === 401) signOut(message);
      throw new ApiError(resp.status, message);
    }
    return resp;
  }

  // --- sign in ---------------------------------------------------------------------------

  function keyLabel(key) {
    const match = /^(ifk_[0-9a-f]+)_/.exec(key);
    return match ? `key ${match[1]}` : "token";
  }

  async function signIn(key) {
    state.key = key;
    try {
      await loadCollections();
    } catch (exc) {
      state.key = null;
      sessionStorage.removeItem(KEY_STORE);
      throw exc;
    }
    sessionStorage.setItem(KEY_STORE, key);
    $("who-text").textContent = `Signed in with ${keyLabel(key)}`;
    $("who").hidden = false;
    $("signin").hidden = true;
    $("app").hidden = false;
  }

  function signOut(message) {
    stopPolling();
    if (state.askAbort) state.askAbort.abort();
    state.key = null;
    state.collections = [];
    state.current = null;
    sessionStorage.removeItem(KEY_STORE);
    $("app").hidden = true;
    $("who").hidden = true;
    $("signin").hidden = false;
    $("key").value = "";
    if (message) showAlert(message);
    else clearAlert();
    $("key").focus();
  }

  // --- collections -----------------------------------------------------------------------

  function accessText(c) {
    if (c.read && c.write) return "read and add";
    return c.read ? "read only" : "add only";
  }

  function optionText(c) {
    const n = c.documents ?? 0;
    return `${c.name} (${accessText(c)}, ${n} document${n === 1 ? "" : "s"})`;
  }

  async function loadCollections() {
    let resp;
    try {
      resp = await api("/v1/kb/collections", { method: "GET" }, "list the collections");
    } catch (exc) {
      if (exc.status === 404) {
        throw new ApiError(404, "This server does not serve the knowledge base (404 on /v1/kb/collections): "
          + "start it with the kb vertical and INDUSFLOW_KB_COLLECTIONS set.");
      }
      throw exc;
    }
    const body = await resp.json();
    state.collections = body.collections || [];
    if (!state.collections.length) {
      throw new ApiError(403, "This key may not read or add to any collection: ask for a key with a kb:<collection>:read scope.");
    }
    const select = $("collection");
    const previous = state.current ? state.current.name : sessionStorage.getItem(COLLECTION_STORE);
    select.replaceChildren(
      ...state.collections.map((c) =>
        el("option", { value: c.name, text: optionText(c) })),
    );
    const keep = state.collections.find((c) => c.name === previous) || state.collections[0];
    select.value = keep.name;
    selectCollection(keep.name);
  }

  function selectCollection(name) {
    const c = state.collections.find((x) => x.name === name);
    if (!c) return;
    const changed = !state.current || state.current.name !== c.name;
    state.current = c;
    sessionStorage.setItem(COLLECTION_STORE, c.name);
    $("collection-info").textContent = c.read && c.write
      ? "You may ask questions and add documents."
      : c.read ? "You may ask questions; this key cannot add documents." : "You may add documents; this key cannot ask.";
    $("upload-form").hidden = !c.write;
    $("upload-denied").hidden = c.write;
    $("ask-btn").disabled = !c.read;
    $("question").disabled = !c.read;
    if (changed) {
      stopPolling();
      resetAnswer();
      $("job-status").textContent = "";
    }
    refreshDocuments();
  }

  // --- documents -------------------------------------------------------------------------

  function statusBadge(status) {
    const known = STATUSES.has(status) ? status : "unknown";
    return el("span", { class: `st st-${known}`, text: String(status) });
  }

  function renderDocuments(documents) {
    const canDelete = state.current && state.current.write;
    const rows = documents.map((d) => el("tr", {},
      el("td", { class: "name", text: d.name,
        title: d.in_folder === false ? "ingested from outside the watched folder" : d.updated_at ? `updated ${d.updated_at}` : "" }),
      el("td", {}, statusBadge(d.status),
        d.status === "quarantined" && d.reason ? el("span", { class: "why", text: d.reason }) : null,
        d.quarantined_members && d.status !== "quarantined"
          ? el("span", { class: "members", text: `${d.quarantined_members} member${d.quarantined_members > 1 ? "s" : ""} quarantined` })
          : null),
      el("td", { class: "num", text: d.status === "indexed" ? String(d.chunks ?? "") : "" }),
      el("td", { class: "actions" }, canDelete
        ? el("button", { type: "button", class: "link danger", text: "Delete", "aria-label": `Delete ${d.name}`,
          onclick: () => deleteDocument(d.name) })
        : null),
    ));
    $("docs").tBodies[0].replaceChildren(...rows);
    const counts = {};
    for (const d of documents) counts[d.status] = (counts[d.status] || 0) + 1;
    const order = ["indexed", "pending", "quarantined"];
    const statuses = Object.keys(counts).sort((a, b) => (order.indexOf(a) + 1 || 9) - (order.indexOf(b) + 1 || 9));
    $("docs-summary").textContent = documents.length
      ? `${documents.length} document${documents.length === 1 ? "" : "s"}: `
        + statuses.map((s) => `${counts[s]} ${s}`).join(" · ")
      : "No documents yet.";
    const quarantined = documents.filter((d) => d.status === "quarantined");
    $("quarantine-list").replaceChildren(...quarantined.map((d) =>
      el("li", {}, el("span", { class: "name", text: d.name }), el("span", { class: "reason", text: d.reason || "no reason given" }))));
    $("quarantine").hidden = quarantined.length === 0;
    $("docs").hidden = documents.length === 0;
    return documents;
  }

  async function refreshDocuments() {
    const c = state.current;
    if (!c) return [];
    if (!$("docs").tBodies[0].rows.length) $("docs-summary").textContent = "Loading the documents…";
    try {
      const resp = await api(`/v1/kb/documents?collection=${encodeURIComponent(c.name)}`, { method: "GET" },
        `list the documents of ${c.name}`);
      const body = await resp.json();
      if (state.current !== c) return [];
      const documents = renderDocuments(body.documents || []);
      // the picker counts what the list shows (documents ingested from the command line included)
      c.documents = documents.length;
      const option = [...$("collection").options].find((o) => o.value === c.name);
      if (option) option.textContent = optionText(c);
      // documents still waiting for the ingest run: look again shortly
      clearTimeout(state.docsTimer);
      if (documents.some((d) => d.status === "pending") && !state.jobTimer) {
        state.docsTimer = setTimeout(refreshDocuments, 2 * POLL_MS);
      }
      return documents;
    } catch (exc) {
      $("docs-summary").textContent = exc.message;
      return [];
    }
  }

  async function deleteDocument(name) {
    const c = state.current;
    if (!window.confirm(`Delete ${name} from ${c.name}? Its passages are removed from the index.`)) return;
    try {
      const resp = await api(`/v1/kb/documents/${encodeURIComponent(name)}?collection=${encodeURIComponent(c.name)}`,
        { method: "DELETE" }, `delete documents from ${c.name}`);
      const body = await resp.json();
      showAlert(`Deleted ${body.deleted} (${body.chunks_removed} passages removed).`, "info");
      refreshCounts();
    } catch (exc) {
      showAlert(exc.message);
    }
    refreshDocuments();
  }

  // --- upload ------------------------------------------------------------------------------

  function stopPolling() {
    clearTimeout(state.jobTimer);
    clearTimeout(state.docsTimer);
    state.jobTimer = null;
    state.docsTimer = null;
  }

  function describeFiles(files) {
    return (files || []).map((f) => {
      const detail = f.reason || (f.status === "indexed" && f.chunks ? `${f.chunks} passage${f.chunks === 1 ? "" : "s"}` : "");
      return `${f.name}: ${f.status}${detail ? ` (${detail})` : ""}`;
    }).join(", ");
  }

  async function upload(event) {
    event.preventDefault();
    clearAlert();
    const c = state.current;
    const files = $("files").files;
    if (!files.length) return;
    const form = new FormData();
    form.append("collection", c.name);
    for (const f of files) form.append("files", f, f.name);
    $("upload-btn").disabled = true;
    $("job-status").textContent = `Uploading ${files.length} file${files.length > 1 ? "s" : ""}…`;
    try {
      const resp = await api("/v1/kb/documents", { method: "POST", body: form }, `add documents to ${c.name}`);
      const job = await resp.json();
      $("files").value = "";
      $("job-status").textContent = `Queued for indexing: ${describeFiles(job.files)}`;
      pollJob(job.job_id, c);
    } catch (exc) {
      $("job-status").textContent = "";
      showAlert(exc.message);
    } finally {
      $("upload-btn").disabled = false;
    }
  }

  async function pollJob(jobId, c) {
    clearTimeout(state.jobTimer);
    state.jobTimer = null;
    if (state.current !== c) return;
    let job;
    try {
      const resp = await api(`/v1/kb/jobs/${encodeURIComponent(jobId)}`, { method: "GET" }, "follow the upload");
      job = await resp.json();
    } catch (exc) {
      $("job-status").textContent = exc.message;
      return;
    }
    const status = $("job-status");
    status.replaceChildren(statusBadge(job.state), ` ${describeFiles(job.files)}`);
    if (job.state === "done" || job.state === "failed") {
      if (job.state === "failed" && job.error) status.append(` ${job.error}`);
      await refreshDocuments();
      refreshCounts();
      return;
    }
    await refreshDocuments();
    state.jobTimer = setTimeout(() => pollJob(jobId, c), POLL_MS);
  }

  async function refreshCounts() {
    try {
      const resp = await api("/v1/kb/collections", { method: "GET" }, "list the collections");
      const body = await resp.json();
      for (const fresh of body.collections || []) {
        const option = [...$("collection").options].find((o) => o.value === fresh.name);
        if (option) option.textContent = optionText(fresh);
      }
    } catch (_) {
      // the counts are a convenience: the documents list is already fresh
    }
  }

  // --- ask ---------------------------------------------------------------------------------

  function resetAnswer() {
    state.answer = "";
    state.citations = new Map();
    $("answer").replaceChildren();
    delete $("answer").dataset.state;
    $("citations").replaceChildren();
    $("others-list").replaceChildren();
    $("others").hidden = true;
    $("mode").textContent = "";
    showAnswered(true);
    $("answer-box").hidden = true;
    $("passage").hidden = true;
    $("ask-status").textContent = "";
  }

  // An answer the documents do not support is shown as such: its own heading and colour, and the
  // retrieved passages listed as related, not as sources of an answer.
  function showAnswered(answered) {
    const box = $("answer-box");
    if (answered) delete box.dataset.answered; else box.dataset.answered = "false";
    $("answer-h").textContent = answered ? "Answer" : "Not answered";
    $("citations-h").textContent = answered ? "Sources" : "Related passages, not an answer";
  }

  function renderAnswer() {
    const parts = state.answer.split(/(\[\d{1,3}\])/);
    const nodes = parts.filter((p) => p !== "").map((part) => {
      const marker = /^\[(\d{1,3})\]$/.exec(part);
      if (!marker) return document.createTextNode(part);
      const n = Number(marker[1]);
      const passage = state.citations.get(n);
      if (!passage) return el("span", { class: "cite pending", text: String(n), title: "source arriving…" });
      return el("button", { type: "button", class: "cite", text: String(n), "data-n": String(n),
        "aria-label": `Source ${n}: ${passage.title || passage.document}`, onclick: () => showPassage(n) });
    });
    $("answer").replaceChildren(...nodes);
  }

  function sourceName(p) {
    return p.title || p.document || "untitled";
  }

  function placeText(p) {
    const bits = [];
    if (p.title && p.document && p.title !== p.document) bits.push(p.document);
    if (p.page !== null && p.page !== undefined) bits.push(`page ${p.page}`);
    return bits.join(" · ");
  }

  function sourceItem(p) {
    return el("li", {},
      el("button", { type: "button", class: "source", "data-n": String(p.n), onclick: () => showPassage(Number(p.n)) },
        el("span", { class: "n", text: String(p.n) }),
        el("span", { class: "title", text: sourceName(p) }),
        el("span", { class: "meta", text: placeText(p) })));
  }

  function renderCitations(list) {
    state.citations = new Map(list.map((p) => [Number(p.n), p]));
    // the passages the answer cites first; the other retrieved ones folded away
    const flagged = list.some((p) => p.cited === true);
    const cited = flagged ? list.filter((p) => p.cited) : list;
    const others = flagged ? list.filter((p) => !p.cited) : [];
    $("citations").replaceChildren(...cited.map(sourceItem));
    $("others-list").replaceChildren(...others.map(sourceItem));
    $("others-count").textContent = String(others.length);
    $("others").hidden = others.length === 0;
    renderAnswer();
  }

  function showPassage(n) {
    const p = state.citations.get(n);
    if (!p) return;
    $("passage-n").textContent = String(n);
    $("passage-title").textContent = sourceName(p);
    const meta = [];
    if (p.document) meta.push(p.document);
    if (typeof p.score === "number") meta.push(`score ${p.score.toFixed(3)}`);
    $("passage-meta").replaceChildren(...passageMeta(p, meta));
    $("passage-text").replaceChildren(...markedText(p.text || "", p.highlight));
    showEvidenceActions(p);
    for (const b of document.querySelectorAll(".cite[data-n], .source[data-n]")) {
      b.setAttribute("aria-pressed", String(Number(b.dataset.n) === n));
    }
    const box = $("passage");
    box.hidden = false;
    box.focus({ preventScroll: true });
    box.scrollIntoView({ block: "nearest", behavior: "smooth" });
  }

  // --- evidence: the cited sentence marked in its passage, the text around it, the original ----

  // The passage's page first ("page 3"), then the other facts, as text nodes.
  function passageMeta(p, others) {
    const nodes = [];
    if (p.page !== null && p.page !== undefined) nodes.push(el("span", { class: "page", text: `page ${p.page}` }));
    for (const bit of others) {
      if (nodes.length) nodes.push(document.createTextNode(" · "));
      nodes.push(document.createTextNode(bit));
    }
    return nodes;
  }

  // ``text`` as nodes, the spans [start, end) the answer rests on in <mark> (text nodes only).
  function markedText(text, spans) {
    const nodes = [];
    let at = 0;
    const sorted = (Array.isArray(spans) ? spans : [])
      .map((s) => [Number(s[0]), Number(s[1])])
      .filter(([a, b]) => Number.isInteger(a) && Number.isInteger(b) && a < b)
      .sort((x, y) => x[0] - y[0]);
    for (const [a0, b0] of sorted) {
      const a = Math.max(a0, at);
      const b = Math.min(b0, text.length);
      if (a >= b) continue;
      if (a > at) nodes.push(document.createTextNode(text.slice(at, a)));
      nodes.push(el("mark", { text: text.slice(a, b) }));
      at = b;
    }
    if (at < text.length) nodes.push(document.createTextNode(text.slice(at)));
    return nodes;
  }

  function chunkPath(p, what) {
    return `/v1/kb/collections/${encodeURIComponent(state.current.name)}/chunks/${encodeURIComponent(p.chunk_id)}/${what}`;
  }

  function showEvidenceActions(p) {
    const around = $("passage-source");
    around.hidden = !(p.chunk_id && state.current && state.current.read);
    around.disabled = false;
    around.onclick = () => showSourceText(p);
    const download = $("passage-download");
    download.hidden = !(p.chunk_id && state.current && state.current.source);
    download.onclick = () => downloadOriginal(p);
    const first = $("passage-text").querySelector("mark");
    if (first) first.scrollIntoView({ block: "nearest" });
  }

  // The stored (redacted) text of the document around the passage; the passage keeps its marks.
  async function showSourceText(p) {
    clearAlert();
    $("passage-source").disabled = true;
    try {
      const resp = await api(chunkPath(p, "source?around=1"), { method: "GET" }, "read the text around this passage");
      const body = await resp.json();
      if (state.citations.get(Number($("passage-n").textContent)) !== p) return;  // another passage opened since
      const nodes = [];
      if (body.before) nodes.push(el("span", { class: "context", text: `${body.before}\n` }));
      nodes.push(...markedText(p.text || "", p.highlight));
      if (body.after) nodes.push(el("span", { class: "context", text: `\n${body.after}` }));
      $("passage-text").replaceChildren(...nodes);
      const pages = Array.isArray(body.pages) && body.pages.length > 1
        ? `pages ${body.pages[0]}–${body.pages[body.pages.length - 1]}` : "";
      const meta = [p.document, `chunk ${Number(body.chunk_index) + 1} of ${Number(body.chunks)}`, pages].filter(Boolean);
      $("passage-meta").replaceChildren(...passageMeta(p, meta));
      $("passage-source").hidden = true;
      const first = $("passage-text").querySelector("mark");
      if (first) first.scrollIntoView({ block: "center" });
    } catch (exc) {
      $("passage-source").disabled = false;
      showAlert(exc.message);
    }
  }

  async function downloadOriginal(p) {
    clearAlert();
    try {
      const resp = await api(chunkPath(p, "file"), { method: "GET" }, "download the original file");
      const blob = await resp.blob();
      const url = URL.createObjectURL(blob);
      const link = el("a", { href: url, download: (p.document || "document").split("/").pop() });
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10_000);
    } catch (exc) {
      showAlert(exc.message);
    }
  }

  // One server-sent events parser over the fetch body (EventSource cannot POST).
  function sseParser(onEvent) {
    let buffer = "";
    let event = "message";
    let data = [];
    const dispatch = () => {
      if (data.length) onEvent(event, data.join("\n"));
      event = "message";
      data = [];
    };
    const line = (text) => {
      if (text === "") return dispatch();
      if (text.startsWith(":")) return undefined;
      const colon = text.indexOf(":");
      const field = colon < 0 ? text : text.slice(0, colon);
      let value = colon < 0 ? "" : text.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      return undefined;
    };
    return {
      feed(chunk) {
        buffer += chunk;
        // a trailing "\r" may be the first half of "\r\n": keep it for the next chunk
        const hold = buffer.endsWith("\r") ? 1 : 0;
        const lines = buffer.slice(0, buffer.length - hold).split(/\r\n|\r|\n/);
        buffer = lines.pop() + buffer.slice(buffer.length - hold);
        lines.forEach(line);
      },
      end() {
        if (buffer) line(buffer);
        buffer = "";
        dispatch();
      },
    };
  }

  function handleEvent(name, raw) {
    let data;
    try {
      data = JSON.parse(raw);
    } catch (_) {
      data = { text: raw };
    }
    if (name === "token") {
      state.answer += data.text || "";
      renderAnswer();
    } else if (name === "citations") {
      renderCitations(data.citations || []);
    } else if (name === "done") {
      const answered = data.answered !== false;
      showAnswered(answered);
      $("mode").textContent = !answered ? "the documents do not answer this"
        : data.mode === "llm" ? "written by the language model" : data.mode === "extractive"
          ? "sentences quoted from the sources" : String(data.mode || "");
      return answered ? "done" : "unanswered";
    } else if (name === "error") {
      showAlert(`The answer failed: ${data.message || raw}`);
      return "error";
    }
    return null;
  }

  async function ask(event) {
    event.preventDefault();
    clearAlert();
    const c = state.current;
    const question = $("question").value.trim();
    if (!question || !c) return;
    if (state.askAbort) state.askAbort.abort();
    resetAnswer();
    const abort = new AbortController();
    state.askAbort = abort;
    $("answer-box").hidden = false;
    $("answer").setAttribute("aria-busy", "true");
    $("ask-btn").disabled = true;
    $("stop-btn").hidden = false;
    $("ask-status").textContent = "Searching the documents…";
    const started = performance.now();
    let ending = null;
    try {
      const resp = await api("/v1/kb/ask", {
        method: "POST",
        signal: abort.signal,
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify({ collection: c.name, question, top_k: 5, stream: true }),
      }, `ask in ${c.name}`);
      if (!(resp.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
        const body = await resp.json();  // a server that answered in one piece
        state.answer = body.answer || "";
        renderCitations(body.citations || []);
        ending = handleEvent("done", JSON.stringify({ mode: body.mode, answered: body.answered }));
      } else {
        $("ask-status").textContent = "Answering…";
        const parser = sseParser((name, raw) => {
          ending = handleEvent(name, raw) || ending;
        });
        const reader = resp.body.getReader();
        const decoder = new TextDecoder();
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          parser.feed(decoder.decode(value, { stream: true }));
        }
        parser.feed(decoder.decode());
        parser.end();
      }
      const seconds = ((performance.now() - started) / 1000).toFixed(1);
      $("ask-status").textContent = ending === "done" ? `Answered in ${seconds} s.`
        : ending === "unanswered" ? `Not answered: the documents of ${c.name} do not support an answer (${seconds} s).`
          : ending === "error" ? "" : "The answer stopped before its end.";
      if (!state.answer && ending === "done") $("answer").textContent = "No answer was found in this collection.";
    } catch (exc) {
      if (exc.name === "AbortError") {
        $("ask-status").textContent = "Stopped.";
      } else {
        $("ask-status").textContent = "";
        showAlert(exc.message);
        if (!state.answer) $("answer-box").hidden = true;
      }
    } finally {
      if (state.askAbort === abort) state.askAbort = null;
      $("answer").setAttribute("aria-busy", "false");
      $("answer").dataset.state = ending || "stopped";
      $("ask-btn").disabled = !(state.current && state.current.read);
      $("stop-btn").hidden = true;
    }
  }

  // --- wiring ------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    $("signin-form").addEventListener("submit", async (event) => {
      event.preventDefault();
      clearAlert();
      const key = $("key").value.trim();
      if (!key) return;
      try {
        await signIn(key);
      } catch (exc) {
        showAlert(exc.message);
        $("key").select();
      }
    });
    $("signout").addEventListener("click", () => signOut());
    $("collection").addEventListener("change", (e) => selectCollection(e.target.value));
    $("ask-form").addEventListener("submit", ask);
    $("question").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {
        e.preventDefault();
        $("ask-form").requestSubmit();
      }
    });
    $("stop-btn").addEventListener("click", () => state.askAbort && state.askAbort.abort());
    $("upload-form").addEventListener("submit", upload);
    $("refresh").addEventListener("click", refreshDocuments);
    $("passage-close").addEventListener("click", () => {
      $("passage").hidden = true;
    });
    if (state.key) {
      signIn(state.key).catch((exc) => signOut(exc.message));
    } else {
      $("key").focus();
    }
  });
})();
