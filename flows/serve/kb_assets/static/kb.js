// The knowledge-base page: sign in with a key, pick a collection, ask (the answer streams in
// over POST + server-sent events), follow up in a conversation (earlier turns go with each
// question), vote on answers, read the cited passages, upload documents and follow their
// indexing. In English or Chinese (the browser's language, or the switch). Every text that comes
// from the server goes into the page through textContent: passages and file names are untrusted.
"use strict";
(() => {
  const KEY_STORE = "indusflow.kb.key";
  const COLLECTION_STORE = "indusflow.kb.collection";
  const POLL_MS = 1000;
  const STATUSES = new Set(["indexed", "pending", "quarantined", "queued", "running", "done", "failed"]);
  const LANG_STORE = "indusflow.kb.lang";
  const ADVANCED_STORE = "indusflow.kb.advanced";
  const MAX_TURNS = 8;  // earlier turns sent with a question (the API's limit)

  // Every text of the page, by language; {name} is filled in by t().
  const STRINGS = {
    en: {
      title: "Knowledge base · indusflow",
      brand: "knowledge base",
      signIn: "Sign in",
      signOut: "Sign out",
      signInHint: "Paste the API key you were given (ifk_…). It stays in this browser tab only and is sent with each request; closing the tab forgets it.",
      apiKey: "API key",
      signedInKey: "Signed in with key {id}",
      signedInToken: "Signed in with a token",
      collection: "Collection",
      ask: "Ask",
      askBtn: "Ask",
      stop: "Stop",
      question: "Question",
      questionPlaceholder: "Ask a question about the documents of this collection",
      followPlaceholder: "Ask a follow-up question (or a new one)",
      newChat: "New conversation",
      conversation: "Conversation",
      advanced: "Advanced",
      retriever: "Retriever",
      hybrid: "hybrid (dense + BM25)",
      dense: "dense (meaning)",
      bm25: "BM25 (words)",
      topK: "Passages",
      others: "Also retrieved, not cited",
      close: "Close",
      closePassage: "Close the passage",
      page: "page {n}",
      pages: "pages {a}–{b}",
      chunkOf: "chunk {i} of {n}",
      showAround: "Show the text around it",
      downloadOriginal: "Download the original file",
      whatAround: "read the text around this passage",
      whatOriginal: "download the original file",
      addDocuments: "Add documents",
      files: "Files (PDF, Office, HTML, e-mail, text, archives…)",
      upload: "Upload",
      uploadDenied: "This key may read this collection but not add to it.",
      documents: "Documents",
      refresh: "Refresh",
      name: "Name",
      status: "Status",
      chunks: "Chunks",
      actions: "Actions",
      quarantined: "Quarantined",
      quarantineHint: "These files were not indexed; fix them and upload again.",
      footer: "Answers cite the passages they come from: click a number to read the source.",
      apiRef: "API reference:",
      readAdd: "read and add",
      readOnly: "read only",
      addOnly: "add only",
      option: "{name} ({access}, {n} {docs})",
      docOne: "document",
      docMany: "documents",
      mayBoth: "You may ask questions and add documents.",
      mayRead: "You may ask questions; this key cannot add documents.",
      mayAdd: "You may add documents; this key cannot ask.",
      answer: "Answer",
      notAnswered: "Not answered",
      sources: "Sources",
      related: "Related passages, not an answer",
      modeNone: "the documents do not answer this",
      modeLlm: "written by the language model",
      modeExtractive: "sentences quoted from the sources",
      searching: "Searching the documents…",
      answering: "Answering…",
      answeredIn: "Answered in {s} s.",
      unansweredIn: "Not answered: the documents of {c} do not support an answer ({s} s).",
      cutShort: "The answer stopped before its end.",
      noAnswer: "No answer was found in this collection.",
      stopped: "Stopped.",
      failed: "The answer failed: {m}",
      searchedFor: "Searched for: {q}",
      sourcesOf: "Sources: {names}",
      voteUp: "Good answer",
      voteDown: "Bad answer",
      voteUpShort: "Helpful",
      voteDownShort: "Not helpful",
      voteThanks: "Thanks: your vote is recorded.",
      voteFailed: "The vote was not recorded: {m}",
      noDocs: "No documents yet.",
      loadingDocs: "Loading the documents…",
      docsSummary: "{n} {docs}: {parts}",
      deleteBtn: "Delete",
      deleteLabel: "Delete {name}",
      deleteConfirm: "Delete {name} from {c}? Its passages are removed from the index.",
      deleted: "Deleted {name} ({n} passages removed).",
      membersQuarantined: "{n} quarantined",
      noReason: "no reason given",
      uploading: "Uploading {n} file(s)…",
      queued: "Queued for indexing: {files}",
      err401: "Your key was not accepted (401): it is wrong, expired or revoked. Sign in again with a valid key.",
      err403: "This key is not allowed to {what} (403).",
      err429: "Too many requests (429): the rate limit of this key is reached. Try again {when}.",
      inSeconds: "in {s} s",
      inAMoment: "in a moment",
      err404: "Not found (404) while trying to {what}.",
      err413: "Too large (413): {detail}.",
      tooLarge: "the request is over the server's size limit",
      errOther: "Could not {what} ({status}).",
      unreachable: "Could not reach the server to {what} ({m}).",
      noKb: "This server does not serve the knowledge base (404 on /v1/kb/collections): start it with the kb vertical and INDUSFLOW_KB_COLLECTIONS set.",
      noCollections: "This key may not read or add to any collection: ask for a key with a kb:<collection>:read scope.",
      whatList: "list the collections",
      whatDocs: "list the documents of {c}",
      whatDelete: "delete documents from {c}",
      whatAdd: "add documents to {c}",
      whatFollow: "follow the upload",
      whatAsk: "ask in {c}",
      whatVote: "vote in {c}",
      passages: "{n} passage(s)",
      st_indexed: "indexed", st_pending: "pending", st_quarantined: "quarantined", st_queued: "queued",
      st_running: "running", st_done: "done", st_failed: "failed",
    },
    zh: {
      title: "知识库 · indusflow",
      brand: "知识库",
      signIn: "登录",
      signOut: "退出",
      signInHint: "粘贴您获得的 API 密钥（ifk_…）。它只保存在此浏览器标签页中，随每个请求发送；关闭标签页即忘记。",
      apiKey: "API 密钥",
      signedInKey: "已用密钥 {id} 登录",
      signedInToken: "已用令牌登录",
      collection: "文档集",
      ask: "提问",
      askBtn: "提问",
      stop: "停止",
      question: "问题",
      questionPlaceholder: "就此文档集中的文档提问",
      followPlaceholder: "继续追问（或提一个新问题）",
      newChat: "新对话",
      conversation: "对话",
      advanced: "高级选项",
      retriever: "检索方式",
      hybrid: "混合（向量 + BM25）",
      dense: "向量（语义）",
      bm25: "BM25（词语）",
      topK: "段落数",
      others: "也检索到但未引用",
      close: "关闭",
      closePassage: "关闭段落",
      page: "第 {n} 页",
      pages: "第 {a}–{b} 页",
      chunkOf: "第 {i} 段，共 {n} 段",
      showAround: "查看上下文",
      downloadOriginal: "下载原始文件",
      whatAround: "查看此段落的上下文",
      whatOriginal: "下载原始文件",
      addDocuments: "添加文档",
      files: "文件（PDF、Office、HTML、邮件、文本、压缩包…）",
      upload: "上传",
      uploadDenied: "此密钥可以读取此文档集，但不能添加文档。",
      documents: "文档",
      refresh: "刷新",
      name: "名称",
      status: "状态",
      chunks: "段数",
      actions: "操作",
      quarantined: "已隔离",
      quarantineHint: "这些文件未被索引；修复后请重新上传。",
      footer: "回答会引用其来源段落：点击编号即可阅读原文。",
      apiRef: "API 文档：",
      readAdd: "可读可添加",
      readOnly: "只读",
      addOnly: "仅添加",
      option: "{name}（{access}，{n} {docs}）",
      docOne: "个文档",
      docMany: "个文档",
      mayBoth: "您可以提问并添加文档。",
      mayRead: "您可以提问；此密钥不能添加文档。",
      mayAdd: "您可以添加文档；此密钥不能提问。",
      answer: "回答",
      notAnswered: "未回答",
      sources: "来源",
      related: "相关段落（并非回答）",
      modeNone: "文档中没有这个问题的答案",
      modeLlm: "由语言模型撰写",
      modeExtractive: "摘自来源的句子",
      searching: "正在检索文档…",
      answering: "正在回答…",
      answeredIn: "用时 {s} 秒完成回答。",
      unansweredIn: "未回答：{c} 中的文档不足以支持回答（{s} 秒）。",
      cutShort: "回答在结束前中断了。",
      noAnswer: "在此文档集中没有找到答案。",
      stopped: "已停止。",
      failed: "回答失败：{m}",
      searchedFor: "检索用语：{q}",
      sourcesOf: "来源：{names}",
      voteUp: "回答有用",
      voteDown: "回答没用",
      voteUpShort: "有用",
      voteDownShort: "没用",
      voteThanks: "谢谢：您的评价已记录。",
      voteFailed: "评价未能记录：{m}",
      noDocs: "还没有文档。",
      loadingDocs: "正在加载文档…",
      docsSummary: "{n} {docs}：{parts}",
      deleteBtn: "删除",
      deleteLabel: "删除 {name}",
      deleteConfirm: "从 {c} 中删除 {name}？它的段落将从索引中移除。",
      deleted: "已删除 {name}（移除 {n} 个段落）。",
      membersQuarantined: "{n} 个成员已隔离",
      noReason: "未给出原因",
      uploading: "正在上传 {n} 个文件…",
      queued: "已排队等待索引：{files}",
      err401: "您的密钥未被接受（401）：它有误、已过期或已吊销。请用有效的密钥重新登录。",
      err403: "此密钥无权{what}（403）。",
      err429: "请求过多（429）：此密钥已达到速率限制。请{when}再试。",
      inSeconds: "在 {s} 秒后",
      inAMoment: "稍后",
      err404: "{what}时未找到（404）。",
      err413: "过大（413）：{detail}。",
      tooLarge: "请求超过了服务器的大小限制",
      errOther: "无法{what}（{status}）。",
      unreachable: "无法连接服务器以{what}（{m}）。",
      noKb: "此服务器不提供知识库（/v1/kb/collections 返回 404）：请启用 kb 模块并设置 INDUSFLOW_KB_COLLECTIONS 后启动。",
      noCollections: "此密钥不能读取或添加任何文档集：请申请带有 kb:<collection>:read 权限的密钥。",
      whatList: "列出文档集",
      whatDocs: "列出 {c} 的文档",
      whatDelete: "从 {c} 删除文档",
      whatAdd: "向 {c} 添加文档",
      whatFollow: "跟踪上传",
      whatAsk: "在 {c} 中提问",
      whatVote: "在 {c} 中评价",
      passages: "{n} 个段落",
      st_indexed: "已索引", st_pending: "待处理", st_quarantined: "已隔离", st_queued: "排队中",
      st_running: "进行中", st_done: "完成", st_failed: "失败",
    },
  };

  const $ = (id) => document.getElementById(id);
  const state = {
    lang: "en",
    turns: [],  // the conversation: {question, answer, answered, mode, retrieval, citations, collection, vote}
    turn: null,  // the turn shown in the answer box
    lastDone: null,
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

  // --- language --------------------------------------------------------------------------

  function t(key, vars) {
    const text = (STRINGS[state.lang] || STRINGS.en)[key] ?? STRINGS.en[key] ?? key;
    return text.replace(/\{(\w+)\}/g, (m, name) => (vars && name in vars ? String(vars[name]) : m));
  }

  // A text of the page that follows the language switch: the key (and its values) stay on the node.
  function setText(node, key, vars) {
    node.dataset.i18n = key;
    if (vars) node.dataset.i18nArgs = JSON.stringify(vars); else delete node.dataset.i18nArgs;
    node.textContent = t(key, vars);
    return node;
  }

  function clearText(node) {
    delete node.dataset.i18n;
    node.textContent = "";
  }

  function browserLanguage() {
    const stored = localStorage.getItem(LANG_STORE);
    if (stored && STRINGS[stored]) return stored;
    const first = (navigator.languages && navigator.languages[0]) || navigator.language || "en";
    return /^zh\b/i.test(first) ? "zh" : "en";
  }

  function applyLanguage(lang, remember) {
    state.lang = STRINGS[lang] ? lang : "en";
    if (remember) localStorage.setItem(LANG_STORE, state.lang);
    document.documentElement.lang = state.lang === "zh" ? "zh-CN" : "en";
    document.title = t("title");
    for (const node of document.querySelectorAll("[data-i18n]")) {
      node.textContent = t(node.dataset.i18n, node.dataset.i18nArgs ? JSON.parse(node.dataset.i18nArgs) : undefined);
    }
    for (const node of document.querySelectorAll("[data-i18n-placeholder]")) {
      node.placeholder = t(node.dataset.i18nPlaceholder);
    }
    for (const node of document.querySelectorAll("[data-i18n-aria]")) {
      node.setAttribute("aria-label", t(node.dataset.i18nAria));
    }
    for (const b of document.querySelectorAll(".lang button[data-lang]")) {
      b.setAttribute("aria-pressed", String(b.dataset.lang === state.lang));
    }
    if (state.current) {
      for (const c of state.collections) {
        const option = [...$("collection").options].find((o) => o.value === c.name);
        if (option) option.textContent = optionText(c);
      }
      selectCollectionTexts(state.current);
      refreshDocuments();
    }
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
        return t("err401");
      case 403:
        return t("err403", { what }) + (detail ? " " + detail : "");
      case 429: {
        const wait = resp.headers.get("Retry-After");
        return t("err429", { when: wait ? t("inSeconds", { s: wait }) : t("inAMoment") });
      }
      case 404:
        return t("err404", { what }) + (detail ? " " + detail : "");
      case 413:
        return t("err413", { detail: detail || t("tooLarge") });
      default:
        return t("errOther", { what, status: `${resp.status}${detail ? ": " + detail : ""}` });
    }
  }

  async function api(path, options, what) {
    let resp;
    try {
      resp = await fetch(path, { ...options, headers: { ...authHeaders(), ...(options.headers || {}) } });
    } catch (exc) {
      if (exc.name === "AbortError") throw exc;
      throw new ApiError(0, t("unreachable", { what, m: exc.message }));
    }
    if (!resp.ok) {
      const message = await errorMessage(resp, what);
      if (resp.status === 401) signOut(message);
      throw new ApiError(resp.status, message);
    }
    return resp;
  }

  // --- sign in ---------------------------------------------------------------------------

  function showKeyLabel(key) {
    const match = /^(ifk_[0-9a-f]+)_/.exec(key);
    if (match) setText($("who-text"), "signedInKey", { id: match[1] }); else setText($("who-text"), "signedInToken");
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
    showKeyLabel(key);
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
    clearConversation();
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
    if (c.read && c.write) return t("readAdd");
    return c.read ? t("readOnly") : t("addOnly");
  }

  function optionText(c) {
    const n = c.documents ?? 0;
    return t("option", { name: c.name, access: accessText(c), n, docs: t(n === 1 ? "docOne" : "docMany") });
  }

  async function loadCollections() {
    let resp;
    try {
      resp = await api("/v1/kb/collections", { method: "GET" }, t("whatList"));
    } catch (exc) {
      if (exc.status === 404) throw new ApiError(404, t("noKb"));
      throw exc;
    }
    const body = await resp.json();
    state.collections = body.collections || [];
    if (!state.collections.length) {
      throw new ApiError(403, t("noCollections"));
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
    selectCollectionTexts(c);
    $("upload-form").hidden = !c.write;
    $("upload-denied").hidden = c.write;
    $("ask-btn").disabled = !c.read;
    $("question").disabled = !c.read;
    if (changed) {
      stopPolling();
      clearConversation();
      resetAnswer();
      $("job-status").textContent = "";
    }
    refreshDocuments();
  }

  function selectCollectionTexts(c) {
    setText($("collection-info"), c.read && c.write ? "mayBoth" : c.read ? "mayRead" : "mayAdd");
  }

  // --- documents -------------------------------------------------------------------------

  function statusText(status) {
    return STATUSES.has(status) ? t(`st_${status}`) : String(status);
  }

  function statusBadge(status) {
    const known = STATUSES.has(status) ? status : "unknown";
    return el("span", { class: `st st-${known}`, text: statusText(status) });
  }

  function renderDocuments(documents) {
    const canDelete = state.current && state.current.write;
    const rows = documents.map((d) => el("tr", {},
      el("td", { class: "name", text: d.name,
        title: d.in_folder === false ? "ingested from outside the watched folder" : d.updated_at ? `updated ${d.updated_at}` : "" }),
      el("td", {}, statusBadge(d.status),
        d.status === "quarantined" && d.reason ? el("span", { class: "why", text: d.reason }) : null,
        d.quarantined_members && d.status !== "quarantined"
          ? el("span", { class: "members", text: t("membersQuarantined", { n: d.quarantined_members }) })
          : null),
      el("td", { class: "num", text: d.status === "indexed" ? String(d.chunks ?? "") : "" }),
      el("td", { class: "actions" }, canDelete
        ? el("button", { type: "button", class: "link danger", text: t("deleteBtn"), "aria-label": t("deleteLabel", { name: d.name }),
          onclick: () => deleteDocument(d.name) })
        : null),
    ));
    $("docs").tBodies[0].replaceChildren(...rows);
    const counts = {};
    for (const d of documents) counts[d.status] = (counts[d.status] || 0) + 1;
    const order = ["indexed", "pending", "quarantined"];
    const statuses = Object.keys(counts).sort((a, b) => (order.indexOf(a) + 1 || 9) - (order.indexOf(b) + 1 || 9));
    $("docs-summary").textContent = documents.length
      ? t("docsSummary", { n: documents.length, docs: t(documents.length === 1 ? "docOne" : "docMany"),
        parts: statuses.map((s) => `${counts[s]} ${statusText(s)}`).join(" · ") })
      : t("noDocs");
    const quarantined = documents.filter((d) => d.status === "quarantined");
    $("quarantine-list").replaceChildren(...quarantined.map((d) =>
      el("li", {}, el("span", { class: "name", text: d.name }), el("span", { class: "reason", text: d.reason || t("noReason") }))));
    $("quarantine").hidden = quarantined.length === 0;
    $("docs").hidden = documents.length === 0;
    return documents;
  }

  async function refreshDocuments() {
    const c = state.current;
    if (!c) return [];
    if (!$("docs").tBodies[0].rows.length) $("docs-summary").textContent = t("loadingDocs");
    try {
      const resp = await api(`/v1/kb/documents?collection=${encodeURIComponent(c.name)}`, { method: "GET" },
        t("whatDocs", { c: c.name }));
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
    if (!window.confirm(t("deleteConfirm", { name, c: c.name }))) return;
    try {
      const resp = await api(`/v1/kb/documents/${encodeURIComponent(name)}?collection=${encodeURIComponent(c.name)}`,
        { method: "DELETE" }, t("whatDelete", { c: c.name }));
      const body = await resp.json();
      showAlert(t("deleted", { name: body.deleted, n: body.chunks_removed }), "info");
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
      const detail = f.reason || (f.status === "indexed" && f.chunks ? t("passages", { n: f.chunks }) : "");
      return `${f.name}: ${statusText(f.status)}${detail ? ` (${detail})` : ""}`;
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
    $("job-status").textContent = t("uploading", { n: files.length });
    try {
      const resp = await api("/v1/kb/documents", { method: "POST", body: form }, t("whatAdd", { c: c.name }));
      const job = await resp.json();
      $("files").value = "";
      $("job-status").textContent = t("queued", { files: describeFiles(job.files) });
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
      const resp = await api(`/v1/kb/jobs/${encodeURIComponent(jobId)}`, { method: "GET" }, t("whatFollow"));
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
      const resp = await api("/v1/kb/collections", { method: "GET" }, t("whatList"));
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
    delete $("answer").dataset.i18n;
    delete $("ask-status").dataset.i18n;
    $("citations").replaceChildren();
    $("others-list").replaceChildren();
    $("others").hidden = true;
    $("mode").textContent = "";
    delete $("mode").dataset.i18n;
    showAnswered(true);
    $("feedback").replaceChildren();
    $("feedback").hidden = true;
    $("searched").hidden = true;
    $("turn-q").textContent = "";
    state.lastDone = null;
    $("answer-box").hidden = true;
    $("passage").hidden = true;
    $("ask-status").textContent = "";
  }

  // An answer the documents do not support is shown as such: its own heading and colour, and the
  // retrieved passages listed as related, not as sources of an answer.
  function showAnswered(answered) {
    const box = $("answer-box");
    if (answered) delete box.dataset.answered; else box.dataset.answered = "false";
    setText($("answer-h"), answered ? "answer" : "notAnswered");
    setText($("citations-h"), answered ? "sources" : "related");
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
    if (p.page !== null && p.page !== undefined) bits.push(t("page", { n: p.page }));
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
    if (p.page !== null && p.page !== undefined) nodes.push(el("span", { class: "page", text: t("page", { n: p.page }) }));
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
      const resp = await api(chunkPath(p, "source?around=1"), { method: "GET" }, t("whatAround"));
      const body = await resp.json();
      if (state.citations.get(Number($("passage-n").textContent)) !== p) return;  // another passage opened since
      const nodes = [];
      if (body.before) nodes.push(el("span", { class: "context", text: `${body.before}\n` }));
      nodes.push(...markedText(p.text || "", p.highlight));
      if (body.after) nodes.push(el("span", { class: "context", text: `\n${body.after}` }));
      $("passage-text").replaceChildren(...nodes);
      const pages = Array.isArray(body.pages) && body.pages.length > 1
        ? t("pages", { a: body.pages[0], b: body.pages[body.pages.length - 1] }) : "";
      const meta = [p.document, t("chunkOf", { i: Number(body.chunk_index) + 1, n: Number(body.chunks) }), pages]
        .filter(Boolean);
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
      const resp = await api(chunkPath(p, "file"), { method: "GET" }, t("whatOriginal"));
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
      state.lastDone = data;
      showAnswered(answered);
      const modeKey = !answered ? "modeNone" : data.mode === "llm" ? "modeLlm" : data.mode === "extractive" ? "modeExtractive" : null;
      if (modeKey) setText($("mode"), modeKey); else $("mode").textContent = String(data.mode || "");
      showSearched(data.retrieval_question);
      return answered ? "done" : "unanswered";
    } else if (name === "error") {
      showAlert(t("failed", { m: data.message || raw }));
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
    archiveTurn();
    const history = conversationHistory();
    resetAnswer();
    $("turn-q").textContent = question;
    $("question").value = "";
    const abort = new AbortController();
    state.askAbort = abort;
    $("answer-box").hidden = false;
    $("answer").setAttribute("aria-busy", "true");
    $("ask-btn").disabled = true;
    $("stop-btn").hidden = false;
    setText($("ask-status"), "searching");
    const started = performance.now();
    let ending = null;
    try {
      const resp = await api("/v1/kb/ask", {
        method: "POST",
        signal: abort.signal,
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify({ collection: c.name, question, ...advancedOptions(), history, stream: true }),
      }, t("whatAsk", { c: c.name }));
      if (!(resp.headers.get("Content-Type") || "").startsWith("text/event-stream")) {
        const body = await resp.json();  // a server that answered in one piece
        state.answer = body.answer || "";
        renderCitations(body.citations || []);
        ending = handleEvent("done", JSON.stringify({ mode: body.mode, answered: body.answered,
          retrieval_question: body.retrieval_question }));
      } else {
        setText($("ask-status"), "answering");
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
      if (ending === "done") setText($("ask-status"), "answeredIn", { s: seconds });
      else if (ending === "unanswered") setText($("ask-status"), "unansweredIn", { c: c.name, s: seconds });
      else if (ending === "error") clearText($("ask-status"));
      else setText($("ask-status"), "cutShort");
      if (!state.answer && ending === "done") setText($("answer"), "noAnswer");
      if (ending === "done" || ending === "unanswered") finishTurn(c, question, ending);
    } catch (exc) {
      if (exc.name === "AbortError") {
        setText($("ask-status"), "stopped");
      } else {
        clearText($("ask-status"));
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

  // --- conversation and votes --------------------------------------------------------------

  // The retriever and top-k of the "Advanced" controls (kept in this browser).
  function advancedOptions() {
    const topK = Math.min(20, Math.max(1, Math.round(Number($("top-k").value) || 5)));
    const retriever = ["hybrid", "dense", "bm25"].includes($("retriever").value) ? $("retriever").value : "hybrid";
    localStorage.setItem(ADVANCED_STORE, JSON.stringify({ retriever, top_k: topK }));
    return { retriever, top_k: topK };
  }

  function restoreAdvanced() {
    try {
      const saved = JSON.parse(localStorage.getItem(ADVANCED_STORE) || "{}");
      if (["hybrid", "dense", "bm25"].includes(saved.retriever)) $("retriever").value = saved.retriever;
      if (Number.isInteger(saved.top_k)) $("top-k").value = String(saved.top_k);
    } catch (_) {
      localStorage.removeItem(ADVANCED_STORE);
    }
  }

  // What the server searched for when it was not the question itself (a resolved follow-up).
  function showSearched(retrieval) {
    const box = $("searched");
    if (retrieval) setText(box, "searchedFor", { q: retrieval });
    box.hidden = !retrieval;
  }

  // The earlier turns sent with a question: the answers as shown, without markers' noise cut.
  function conversationHistory() {
    return state.turns.slice(-MAX_TURNS).map((turn) => ({
      question: turn.question.slice(0, 4000), answer: turn.answer.slice(0, 8000) }));
  }

  function finishTurn(c, question, ending) {
    const done = state.lastDone || {};
    const turn = {
      collection: c.name, question, answer: state.answer, answered: ending === "done", mode: done.mode || "",
      retrieval: done.retrieval_question || "", citations: [...state.citations.values()], vote: null,
    };
    turn.votes = voteButtons(turn);
    state.turns.push(turn);
    state.turn = turn;
    $("feedback").replaceChildren(turn.votes);
    $("feedback").hidden = false;
    $("new-chat").hidden = false;
    $("question").dataset.i18nPlaceholder = "followPlaceholder";
    $("question").placeholder = t("followPlaceholder");
  }

  // The turn in the answer box moves up into the thread (question, answer, cited sources, votes).
  function archiveTurn() {
    const turn = state.turn;
    state.turn = null;
    if (!turn) return;
    const cited = turn.citations.filter((p) => p.cited);
    const names = [...new Set(cited.map((p) => p.title || p.document || ""))].filter(Boolean);
    const item = el("li", { class: "turn", "data-answered": String(turn.answered) },
      el("p", { class: "turn-q", text: turn.question }),
      turn.retrieval ? setText(el("p", { class: "searched" }), "searchedFor", { q: turn.retrieval }) : null,
      el("p", { class: "turn-a", text: turn.answer }),
      names.length ? setText(el("p", { class: "turn-sources" }), "sourcesOf", { names: names.join(" · ") }) : null,
      turn.votes);
    $("thread").append(item);
    $("thread").hidden = false;
  }

  function clearConversation() {
    state.turns = [];
    state.turn = null;
    $("thread").replaceChildren();
    $("thread").hidden = true;
    $("new-chat").hidden = true;
    $("question").dataset.i18nPlaceholder = "questionPlaceholder";
    $("question").placeholder = t("questionPlaceholder");
  }

  function voteButtons(turn) {
    const status = el("span", { class: "vote-status", "aria-live": "polite" });
    const button = (vote, symbol, label, short) => {
      const b = el("button", { type: "button", class: `vote vote-${vote}`, "data-vote": vote, "aria-pressed": "false",
        onclick: () => sendVote(turn, vote, box, status) },
      el("span", { class: "glyph", "aria-hidden": "true", text: symbol }), setText(el("span", {}), short));
      b.dataset.i18nAria = label;
      b.setAttribute("aria-label", t(label));
      return b;
    };
    const box = el("div", { class: "votes" }, button("up", "▲", "voteUp", "voteUpShort"),
      button("down", "▼", "voteDown", "voteDownShort"), status);
    return box;
  }

  async function sendVote(turn, vote, box, status) {
    const chunkIds = turn.citations.filter((p) => p.cited).map((p) => String(p.chunk_id));
    try {
      await api("/v1/kb/feedback", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ collection: turn.collection, vote, question: turn.question,
          retrieval_question: turn.retrieval, answer: turn.answer.slice(0, 20000), chunk_ids: chunkIds.slice(0, 50),
          answered: turn.answered, mode: turn.mode.slice(0, 20) }),
      }, t("whatVote", { c: turn.collection }));
      turn.vote = vote;
      for (const b of box.querySelectorAll("button[data-vote]")) b.setAttribute("aria-pressed", String(b.dataset.vote === vote));
      setText(status, "voteThanks");
    } catch (exc) {
      status.textContent = t("voteFailed", { m: exc.message });
      delete status.dataset.i18n;
    }
  }

  // --- wiring ------------------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
    applyLanguage(browserLanguage(), false);
    restoreAdvanced();
    for (const b of document.querySelectorAll(".lang button[data-lang]")) {
      b.addEventListener("click", () => applyLanguage(b.dataset.lang, true));
    }
    $("new-chat").addEventListener("click", () => {
      if (state.askAbort) state.askAbort.abort();
      clearConversation();
      resetAnswer();
      $("question").focus();
    });
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
