// The webchat page: shows the conversation the server keeps, sends messages, shows progress.
//
// - On load: GET /api/history (this browser's user id) -> the recent messages, newest in view.
// - Send: POST /api/messages {user_id, text, message_id}; while it is pending a progress line
//   shows (with the time so far) and the page polls /api/history every POLL_BUSY_MS, so notices
//   ("compacting earlier messages…") and anything stored meanwhile show up; the progress line
//   takes the latest notice as its label. After the reply, one more sync places it by seq.
// - Idle: a slow poll (POLL_IDLE_MS, only while the tab is visible) picks up reminders and
//   messages sent from another tab; a turn running when the page loads shows progress too.
// - New chat: clears the view and sends "/new" (the chat command that starts a fresh context);
//   the page also remembers, per user, the newest seq it cleared, so a reload stays fresh.
// Replies are rendered with markdown.js (DOM nodes only, never HTML); the user's own text as
// plain text.
(function () {
  "use strict";

  const POLL_BUSY_MS = 1500;
  const POLL_IDLE_MS = 20000;
  const HISTORY_LIMIT = 50;
  const SHOW_ELAPSED_AFTER_S = 3;

  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const form = $("form");
  const input = $("text");
  const sendButton = $("send");
  const newChat = $("new-chat");
  const API = form.dataset.api || "/api/messages";
  const HISTORY_API = form.dataset.history || "/api/history";
  const markdown = window.GatehouseMarkdown;

  const storage = {
    get(key) {
      try { return window.localStorage.getItem(key); } catch (_err) { return null; }
    },
    set(key, value) {
      try { window.localStorage.setItem(key, value); } catch (_err) { /* this tab only */ }
    },
  };

  function randomHex(bytes) {
    const buf = new Uint8Array(bytes);
    window.crypto.getRandomValues(buf); // (crypto.randomUUID needs https; this does not)
    return Array.from(buf, (b) => b.toString(16).padStart(2, "0")).join("");
  }

  let userId = storage.get("gatehouse-user");
  if (!userId) {
    userId = "web-" + randomHex(16);
    storage.set("gatehouse-user", userId);
  }
  const clearedKey = "gatehouse-cleared:" + userId;
  $("who").textContent = "you are " + userId;
  $("who").title = userId;

  const state = {
    lastSeq: 0,
    cleared: Number(storage.get(clearedKey)) || 0,
    seqs: new Set(), // seqs shown
    hiddenMids: new Set(), // message ids sent without a bubble ("/new")
    notices: new Map(), // notice text -> its element (a stored copy is not shown twice)
    pending: false, // a POST is in flight
    serverBusy: false, // the server says a turn of this session is running
    epoch: 0, // bumped when a POST ends: older polls no longer decide `serverBusy`
    turnTexts: null, // assistant texts shown since the current send began
    sharedNoted: false,
  };

  function el(tag, cls, text) {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // ---- the log ------------------------------------------------------------------------------

  function nearBottom() {
    return log.scrollHeight - log.scrollTop - log.clientHeight < 80;
  }

  function scrollToEnd() {
    log.scrollTop = log.scrollHeight;
  }

  function place(node, stick) {
    const follow = stick || nearBottom();
    if (progress.node && progress.node.parentNode === log) log.insertBefore(node, progress.node);
    else log.appendChild(node);
    if (follow) scrollToEnd();
    return node;
  }

  function bubble(role, text, options) {
    const opts = options || {};
    const node = el("div", "msg " + (role === "user" ? "user" : "bot"));
    if (role === "user") {
      node.textContent = text;
    } else {
      node.classList.add("md");
      node.appendChild(markdown.render(text));
    }
    if (opts.seq) node.dataset.seq = String(opts.seq);
    if (opts.mid) node.dataset.mid = opts.mid;
    if (opts.status) node.dataset.status = opts.status;
    if (opts.status === "error") node.classList.add("failed");
    if (opts.at) node.title = new Date(opts.at).toLocaleString();
    return place(node, opts.stick);
  }

  function line(cls, text) {
    return place(el("div", "msg " + cls, text), true);
  }

  function addNotice(text) {
    if (state.notices.has(text)) return;
    state.notices.set(text, line("notice", text));
    if (progress.node) progress.label(text);
  }

  function seen(seq) {
    state.seqs.add(seq);
    if (seq > state.lastSeq) state.lastSeq = seq;
  }

  function renderLine(m, stick) {
    if (state.seqs.has(m.seq) || m.seq <= state.cleared) return;
    if (m.role === "user" && m.message_id) {
      if (state.hiddenMids.has(m.message_id)) { seen(m.seq); return; }
      const mine = log.querySelector('[data-mid="' + CSS.escape(m.message_id) + '"]');
      if (mine) { mine.dataset.seq = String(m.seq); seen(m.seq); return; }
    }
    if (m.role === "assistant") {
      const notice = state.notices.get(m.text);
      if (notice && !notice.dataset.seq) { notice.dataset.seq = String(m.seq); seen(m.seq); return; }
      if (state.turnTexts) state.turnTexts.add(m.text);
    }
    bubble(m.role, m.text, { seq: m.seq, status: m.status, at: m.at, stick });
    seen(m.seq);
  }

  // ---- progress -----------------------------------------------------------------------------

  const progress = {
    node: null,
    text: null,
    elapsed: null,
    started: 0,
    timer: null,
    show(label) {
      if (!this.node) {
        this.node = el("div", "progress");
        this.node.setAttribute("role", "status");
        const dots = el("span", "dots");
        dots.append(el("span"), el("span"), el("span"));
        this.text = el("span", "label", "Working…");
        this.elapsed = el("span", "elapsed");
        this.node.append(dots, this.text, this.elapsed);
        this.started = Date.now();
        this.timer = window.setInterval(() => this.tick(), 1000);
      }
      if (label) this.label(label);
      const follow = nearBottom();
      if (log.lastElementChild !== this.node) log.appendChild(this.node);
      if (follow) scrollToEnd();
    },
    label(text) {
      if (this.text) this.text.textContent = text.length > 120 ? text.slice(0, 119) + "…" : text;
    },
    tick() {
      const s = Math.round((Date.now() - this.started) / 1000);
      if (this.elapsed) this.elapsed.textContent = s >= SHOW_ELAPSED_AFTER_S ? s + " s" : "";
    },
    hide() {
      if (this.timer) window.clearInterval(this.timer);
      if (this.node) this.node.remove();
      this.node = this.text = this.elapsed = this.timer = null;
    },
  };

  function updateProgress() {
    if (state.pending || state.serverBusy) progress.show();
    else progress.hide();
  }

  // ---- the server ---------------------------------------------------------------------------

  async function fetchHistory(after) {
    const query = new URLSearchParams({
      user_id: userId, after: String(after), limit: String(HISTORY_LIMIT),
    });
    const res = await fetch(HISTORY_API + "?" + query.toString(), {
      headers: { Accept: "application/json" }, cache: "no-store",
    });
    const data = await res.json().catch(() => ({}));
    if (!res.ok) throw new Error(data.error || "error " + res.status);
    return data;
  }

  async function sync(stick) {
    const data = await fetchHistory(Math.max(state.lastSeq, state.cleared));
    if (data.shared && !state.sharedNoted) {
      state.sharedNoted = true;
      line("note", "Earlier messages are not shown here: this gateway keeps one conversation "
        + "for every chat.");
    }
    for (const m of data.messages || []) renderLine(m, stick);
    for (const text of data.notices || []) addNotice(text);
    return data;
  }

  let pollTimer = null;
  function schedulePoll(delay) {
    window.clearTimeout(pollTimer);
    const wait = delay !== undefined ? delay
      : state.pending || state.serverBusy ? POLL_BUSY_MS : POLL_IDLE_MS;
    pollTimer = window.setTimeout(poll, wait);
  }

  async function poll() {
    if (document.hidden && !state.pending && !state.serverBusy) { schedulePoll(); return; }
    const epoch = state.epoch;
    try {
      const data = await sync(false);
      if (epoch === state.epoch && !state.pending) state.serverBusy = Boolean(data.busy);
    } catch (_err) {
      /* the next poll tries again */
    }
    updateProgress();
    schedulePoll();
  }

  function setBusyControls(busy) {
    sendButton.disabled = busy;
    newChat.disabled = busy;
  }

  async function submit(text, options) {
    const opts = options || {};
    if (state.pending) return;
    const mid = randomHex(16);
    state.pending = true;
    state.turnTexts = new Set();
    setBusyControls(true);
    if (opts.silent) state.hiddenMids.add(mid);
    else {
      const node = el("div", "msg user", text);
      node.dataset.mid = mid;
      place(node, true);
    }
    progress.show("Working…");
    scrollToEnd();
    schedulePoll(POLL_BUSY_MS);
    let stillRunning = false;
    try {
      const res = await fetch(API, {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/json" },
        body: JSON.stringify({ user_id: userId, text, message_id: mid }),
      });
      const data = await res.json().catch(() => ({}));
      if (res.status === 504) {
        stillRunning = true; // stored, and it will be answered: keep polling for it
        line("note", "Still working on it; the reply will show here when it is ready.");
      } else if (!res.ok) {
        line("err", data.error || "error " + res.status);
      } else {
        try { await sync(true); } catch (_err) { /* the replies below still show */ }
        for (const reply of data.replies || []) {
          // Shown already: placed by the sync, or a notice the polls picked up.
          if (state.turnTexts.has(reply) || state.notices.has(reply)) continue;
          bubble("assistant", reply, { stick: true });
        }
      }
    } catch (err) {
      line("err", "network error: " + err);
    } finally {
      state.pending = false;
      state.turnTexts = null;
      state.epoch += 1;
      state.serverBusy = stillRunning;
      updateProgress();
      setBusyControls(false);
      schedulePoll();
      input.focus();
    }
  }

  // ---- the controls -------------------------------------------------------------------------

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = input.value;
    if (!text.trim() || state.pending) return;
    input.value = "";
    autosize();
    submit(text);
  });

  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });

  function autosize() {
    input.style.height = "";
    if (input.value) input.style.height = Math.max(input.scrollHeight + 2, input.offsetHeight) + "px";
  }
  input.addEventListener("input", autosize);

  // A phone-width screen gets the short placeholder (the long one would be cut off).
  const narrow = window.matchMedia("(max-width: 480px)");
  const longPlaceholder = input.getAttribute("placeholder");
  const shortPlaceholder = input.dataset.shortPlaceholder || longPlaceholder;
  function fitPlaceholder() {
    input.setAttribute("placeholder", narrow.matches ? shortPlaceholder : longPlaceholder);
  }
  narrow.addEventListener("change", fitPlaceholder);
  fitPlaceholder();

  newChat.addEventListener("click", async () => {
    if (state.pending) return;
    log.replaceChildren();
    state.notices.clear();
    state.sharedNoted = false;
    state.cleared = state.lastSeq;
    storage.set(clearedKey, String(state.cleared));
    await submit("/new", { silent: true });
    // Its reply stays in view; after a reload the view starts after it.
    state.cleared = Math.max(state.cleared, state.lastSeq);
    storage.set(clearedKey, String(state.cleared));
  });

  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedulePoll(0);
  });

  async function load() {
    try {
      let data = await sync(true);
      if (typeof data.last_seq === "number" && data.last_seq < state.cleared) {
        // The server's conversation is older than what this browser cleared (a new database).
        state.cleared = 0;
        storage.set(clearedKey, "0");
        data = await sync(true);
      }
      state.serverBusy = Boolean(data.busy);
    } catch (err) {
      line("err", "could not load the conversation: " + err.message);
    }
    scrollToEnd();
    updateProgress();
    schedulePoll();
    document.body.dataset.ready = "true";
  }

  load();
})();
