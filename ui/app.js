// The dedupd operator console. Plain DOM, no dependencies, no build step.
//
// Everything shown comes from the /v1 API with the operator's bearer token
// (kept in sessionStorage). Untrusted text (event bodies, headers, errors)
// only ever reaches the page as text nodes, never as HTML.
"use strict";

(() => {
  const TOKEN_KEY = "dedupd.token";
  const OVERVIEW_REFRESH_MS = 3000;
  const DETAIL_REFRESH_MS = 1500;
  const STATUSES = ["pending", "delivered", "stale", "dead", "erased"];

  const view = document.getElementById("view");
  const alertBox = document.getElementById("alert");
  const login = document.getElementById("login");
  const loginForm = document.getElementById("login-form");
  const loginError = document.getElementById("login-error");
  const forget = document.getElementById("forget");

  /** Pending timer of the current view (refresh), cleared on navigation. */
  let timer = null;
  /** Bumped on every navigation, so a late answer never paints an old view. */
  let generation = 0;

  // ---- DOM helpers -------------------------------------------------------

  /** Builds an element: attributes (on* attributes are refused) and children. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) throw new Error("no inline handlers");
      el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }

  /** A link to a console route. */
  function link(route, text, attrs) {
    return h("a", { href: "#" + route, ...attrs }, text);
  }

  function seg(s) {
    return encodeURIComponent(s);
  }

  // ---- time --------------------------------------------------------------

  /** A <time>: local time shown, UTC on hover. */
  function time(ms) {
    if (ms === null || ms === undefined) return "—";
    const d = new Date(ms);
    const utc = d.toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
    return h("time", { datetime: d.toISOString(), title: utc }, d.toLocaleString());
  }

  /** A <time> for an RFC 3339 string. */
  function rfc3339(text) {
    const ms = Date.parse(text);
    return Number.isNaN(ms) ? text : time(ms);
  }

  /** "45 s", "3 min", "2 h 5 min", "4 d 2 h". */
  function age(ms) {
    if (ms === null || ms === undefined) return "—";
    const s = Math.floor(ms / 1000);
    if (s < 60) return `${s} s`;
    const m = Math.floor(s / 60);
    if (m < 60) return `${m} min`;
    const hrs = Math.floor(m / 60);
    if (hrs < 24) return `${hrs} h ${m % 60} min`;
    return `${Math.floor(hrs / 24)} d ${hrs % 24} h`;
  }

  // ---- API ---------------------------------------------------------------

  class AuthNeeded extends Error {}

  /** An answer the API refused, with its problem document. */
  class Problem extends Error {
    constructor(status, body) {
      super((body && (body.detail || body.title)) || `HTTP ${status}`);
      this.status = status;
      this.code = body && body.code;
    }
  }

  async function api(path, options) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const res = await fetch("/v1" + path, { ...options, headers, cache: "no-store" });
    if (res.status === 401) {
      const had = token !== null;
      sessionStorage.removeItem(TOKEN_KEY);
      askForToken(had ? "The token was refused (401): check it against api.tokens." : null);
      throw new AuthNeeded();
    }
    let body = null;
    try {
      body = await res.json();
    } catch (_) {
      body = null;
    }
    if (!res.ok) throw new Problem(res.status, body);
    forget.hidden = token === null;
    return body;
  }

  function askForToken(message) {
    clearTimeout(timer);
    view.replaceChildren();
    alertBox.hidden = true;
    forget.hidden = true;
    login.hidden = false;
    loginError.hidden = !message;
    loginError.textContent = message || "";
    document.getElementById("token").focus();
  }

  loginForm.addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token");
    const value = input.value.trim();
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    input.value = "";
    login.hidden = true;
    route();
  });

  forget.addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    askForToken(null);
  });

  function showError(err) {
    if (err instanceof AuthNeeded) return;
    alertBox.textContent =
      err instanceof Problem
        ? `${err.message} (${err.status}${err.code ? " " + err.code : ""})`
        : `dedupd did not answer: ${err.message}`;
    alertBox.hidden = false;
  }

  function clearError() {
    alertBox.hidden = true;
    alertBox.textContent = "";
  }

  // ---- views -------------------------------------------------------------

  function deliveryText(row) {
    if (!row.configured) return h("span", { class: "badge removed" }, "removed from config");
    const d = row.delivery;
    if (!d) return "—";
    if (d.state === "paused") {
      return h("span", { class: "badge paused" }, "paused until ", time(d.paused_until_ms),
        ` after ${d.consecutive_failures} failures`);
    }
    if (d.state === "probing") return h("span", { class: "badge paused" }, "probing");
    return h("span", { class: "badge running" }, `running, ${d.in_flight}/${d.max_in_flight} in flight`);
  }

  async function overview(gen) {
    const data = await api("/sources");
    if (gen !== generation) return;
    clearError();
    const title = h("h1", {}, "Sources");
    if (data.sources.length === 0) {
      view.replaceChildren(title, h("p", { class: "empty" },
        "No sources configured: add a [sources.NAME] table to dedupd.toml ",
        "(see docs/gateway.md), run dedupd check-config, then restart dedupd."));
    } else {
      const rows = data.sources.map((s) => h("tr", { "data-source": s.source },
        h("th", { scope: "row" }, link(`/sources/${seg(s.source)}/events?status=${s.dead > 0 ? "dead" : "pending"}`, s.source)),
        STATUSES.map((st) => h("td", { class: "num", "data-count": st },
          link(`/sources/${seg(s.source)}/events?status=${st}`, String(s[st]),
            { "aria-label": `${s[st]} ${st} events of ${s.source}`, class: st === "dead" && s.dead > 0 ? "alarm" : null }))),
        h("td", { "data-age": "" }, s.oldest_pending_age_ms === null ? "—"
          : h("span", { title: "received " + new Date(s.oldest_pending_received_at_ms).toISOString() }, age(s.oldest_pending_age_ms))),
        h("td", {}, deliveryText(s))));
      view.replaceChildren(title, h("div", { class: "scroll" }, h("table", { id: "overview" },
        h("caption", {}, "Every source with its events by status; refreshes every few seconds."),
        h("thead", {}, h("tr", {},
          h("th", { scope: "col" }, "Source"),
          STATUSES.map((st) => h("th", { scope: "col", class: "num" }, st)),
          h("th", { scope: "col" }, "Oldest pending"),
          h("th", { scope: "col" }, "Delivery"))),
        h("tbody", {}, rows))));
    }
    view.append(h("p", { class: "muted" }, "Updated ", time(data.now_ms), "."));
    timer = setTimeout(() => refresh(gen, overview), OVERVIEW_REFRESH_MS);
  }

  async function events(gen, source, params) {
    const status = STATUSES.includes(params.get("status")) ? params.get("status") : "pending";
    const order = params.get("order") === "newest" ? "newest" : "oldest";
    const after = params.get("after");
    const q = new URLSearchParams({ status, order, limit: "50" });
    if (after) q.set("after", after);
    const base = `/sources/${seg(source)}/events`;
    const data = await api(`${base}?${q}`);
    if (gen !== generation) return;
    clearError();
    const here = (st, ord) => `${base}?status=${st}&order=${ord}`;
    const tabs = h("nav", { class: "tabs", "aria-label": "Status" }, STATUSES.map((st) =>
      link(here(st, order), st, { "aria-current": st === status ? "page" : null })));
    const orders = h("p", { class: "order" }, "Order: ",
      link(here(status, "oldest"), "oldest first", { "aria-current": order === "oldest" ? "true" : null }), " · ",
      link(here(status, "newest"), "newest first", { "aria-current": order === "newest" ? "true" : null }));
    let body;
    if (data.events.length === 0) {
      body = h("p", { class: "empty" }, after
        ? `No more ${status} events of ${source}.`
        : `No ${status} events of ${source}. ` + (status === "dead"
          ? "Nothing is waiting for a redeliver."
          : status === "erased" ? "Nothing was erased (or the erased records were reaped)."
            : "Pick another status above."));
    } else {
      body = h("div", { class: "scroll" }, h("table", { id: "events" },
        h("thead", {}, h("tr", {},
          ["Event id", "Stream", "Created", "Attempts", "Last error"].map((c) => h("th", { scope: "col" }, c)))),
        h("tbody", {}, data.events.map((e) => h("tr", { "data-event": e.event_id },
          h("td", {}, link(`${base}/${seg(e.event_id)}`, e.event_id)),
          h("td", {}, e.stream || "—"),
          h("td", {}, rfc3339(e.created_at)),
          h("td", { class: "num" }, String(e.attempts)),
          h("td", { class: "error-text" }, e.last_error || "—"))))));
    }
    const pager = h("p", { class: "pager" },
      after ? link(here(status, order), "First page") : null,
      after && data.next ? " · " : null,
      data.next ? link(`${here(status, order)}&after=${seg(data.next)}`, "Next page", { rel: "next" }) : null);
    view.replaceChildren(
      h("p", { class: "crumbs" }, link("/", "Sources"), " / ", source),
      h("h1", {}, `${source}: ${status} events`), tabs, orders, body, pager);
  }

  async function detail(gen, source, id) {
    const base = `/sources/${seg(source)}/events`;
    const e = await api(`${base}/${seg(id)}`);
    if (gen !== generation) return;
    clearError();
    const rows = [
      ["Status", h("span", { id: "event-status", class: `badge ${e.status}` }, e.status)],
      ["Stream", e.stream || "—"],
      ["Created", rfc3339(e.created_at)],
      ["Received", time(e.received_at_ms)],
      [e.status === "pending" ? "Next attempt" : e.status === "erased" ? "Erased" : "Settled", time(e.due_at_ms)],
      ["Attempts", String(e.attempts)],
      ["Last error", h("span", { id: "event-error", class: "error-text" }, e.last_error || "—")],
      ["Kept until", e.expires_at_ms ? time(e.expires_at_ms) : "—"],
    ];
    let pretty = e.body;
    let kind = "raw";
    if (e.body !== null) {
      try {
        pretty = JSON.stringify(JSON.parse(e.body), null, 2);
        kind = "JSON";
      } catch (_) {
        kind = "text";
      }
    }
    const actions = h("div", { id: "actions" });
    if (e.status === "dead" || e.status === "stale") {
      const ask = h("button", { type: "button", id: "redeliver" }, "Redeliver…");
      ask.addEventListener("click", () => confirmRedeliver(actions, source, id));
      actions.append(ask, " ");
    }
    if (e.status !== "erased") {
      const ask = h("button", { type: "button", id: "erase", class: "danger" }, "Erase…");
      ask.addEventListener("click", () => confirmErase(actions, source, id, e.status));
      actions.append(ask);
    }
    const erased = e.status === "erased";
    view.replaceChildren(
      h("p", { class: "crumbs" }, link("/", "Sources"), " / ",
        link(`${base}?status=${e.status}`, source), " / ", id),
      h("h1", {}, `Event ${id}`),
      h("dl", { class: "fields" }, rows.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
      actions,
      h("h2", {}, "Attempts"),
      timeline(e.timeline),
      h("h2", {}, "Headers"),
      erased ? h("p", { class: "muted" }, "Erased: the stored headers were deleted.")
        : e.headers.length === 0
          ? h("p", { class: "muted" }, "No headers kept (forward_headers lists the ones dedupd keeps).")
          : h("div", { class: "scroll" }, h("table", { id: "headers" }, h("tbody", {},
            e.headers.map((x) => h("tr", {}, h("th", { scope: "row" }, x.name), h("td", {}, x.value)))))),
      ...(erased ? [h("h2", {}, "Body"),
        h("p", { id: "body-erased", class: "empty" }, "Erased: the body was deleted. The record stays, ",
          "with its times and attempts, so a late retry of this event is still a duplicate.")]
        : [h("h2", {}, `Body (${e.body_bytes} bytes, ${e.body === null ? "binary, base64" : kind})`),
          h("pre", { id: "body", tabindex: "0" }, e.body === null ? e.body_base64 : pretty)]));
    // While it is pending, show it settle without a reload.
    if (e.status === "pending") timer = setTimeout(() => refresh(gen, detail, source, id), DETAIL_REFRESH_MS);
  }

  // The event's last attempts (the server keeps ten), newest first.
  function timeline(attempts) {
    if (!attempts || attempts.length === 0) return h("p", { class: "muted", id: "timeline-empty" }, "No attempts yet.");
    return h("div", { class: "scroll" }, h("table", { id: "timeline" },
      h("thead", {}, h("tr", {}, ["#", "Sent", "Status", "Latency", "Error"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, attempts.slice().reverse().map((a) => h("tr", {},
        h("td", { class: "num" }, String(a.attempt)),
        h("td", {}, time(a.at_ms)),
        h("td", { class: "num" }, a.status === null ? "no answer" : String(a.status)),
        h("td", { class: "num" }, `${a.latency_ms.toFixed(1)} ms`),
        h("td", { class: "error-text" }, a.error || "—"))))));
  }

  function confirmRedeliver(actions, source, id) {
    const yes = h("button", { type: "button", id: "redeliver-confirm", class: "primary" }, "Redeliver now");
    const no = h("button", { type: "button", id: "redeliver-cancel" }, "Cancel");
    const box = h("div", { class: "confirm", role: "group", "aria-labelledby": "confirm-text" },
      h("p", { id: "confirm-text" }, `Send ${id} of ${source} again? It goes back to pending with its attempts reset, `,
        "and is delivered to the source's forward_to like a new event."), yes, " ", no);
    actions.replaceChildren(box);
    no.addEventListener("click", () => route());
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      const gen = generation;
      try {
        const r = await api(`/sources/${seg(source)}/events/${seg(id)}/redeliver`, { method: "POST" });
        if (gen !== generation) return;
        actions.replaceChildren(h("p", { class: "notice", role: "status" }, `Redelivered: the event is ${r.status} again.`));
        const status = document.getElementById("event-status");
        status.textContent = r.status;
        status.className = `badge ${r.status}`;
        clearTimeout(timer);
        timer = setTimeout(() => refresh(gen, detail, source, id), DETAIL_REFRESH_MS);
      } catch (err) {
        yes.disabled = false;
        showError(err);
      }
    });
    yes.focus();
  }

  function confirmErase(actions, source, id, status) {
    // A pending event's view refreshes itself: not while the operator decides.
    clearTimeout(timer);
    const yes = h("button", { type: "button", id: "erase-confirm", class: "danger" }, "Erase for good");
    const no = h("button", { type: "button", id: "erase-cancel" }, "Keep it");
    const box = h("div", { class: "confirm danger-zone", role: "group", "aria-labelledby": "erase-text" },
      h("p", { id: "erase-text" }, h("strong", {}, "This cannot be undone. "),
        `Erase ${id} of ${source}? Its body and stored headers are deleted for good; `,
        "the record stays, listed as erased, so a late retry of it is still a duplicate.",
        status === "pending" ? " It is pending: it will never be delivered." : ""), yes, " ", no);
    actions.replaceChildren(box);
    no.addEventListener("click", () => route());
    yes.addEventListener("click", async () => {
      yes.disabled = true;
      no.disabled = true;
      const gen = generation;
      try {
        const r = await api(`/sources/${seg(source)}/events/${seg(id)}`, { method: "DELETE" });
        if (gen !== generation) return;
        // Shown again from the server: erased, without body or headers.
        await detail(gen, source, id);
        if (gen !== generation) return;
        document.getElementById("actions").replaceChildren(h("p", { class: "notice", role: "status", id: "erase-done" },
          `Erased: its body and headers are deleted; the record stays, listed as ${r.status}.`));
      } catch (err) {
        yes.disabled = false;
        no.disabled = false;
        showError(err);
      }
    });
    no.focus();
  }

  function lookups() {
    clearError();
    const claimOut = h("div", { id: "claim-result", "aria-live": "polite" });
    const streamOut = h("div", { id: "stream-result", "aria-live": "polite" });
    const claimForm = h("form", { id: "claim-form" },
      h("label", { for: "claim-key" }, "Claim key"),
      h("input", { id: "claim-key", name: "key", required: true, autocomplete: "off" }),
      h("button", { type: "submit" }, "Look up"));
    const streamForm = h("form", { id: "stream-form" },
      h("label", { for: "stream-name" }, "Stream"),
      h("input", { id: "stream-name", name: "stream", required: true, autocomplete: "off" }),
      h("button", { type: "submit" }, "Look up"));
    const gen = generation;
    const answer = (out, path, found, missing) => async (ev) => {
      ev.preventDefault();
      try {
        const r = await api(path());
        if (gen === generation) out.replaceChildren(found(r));
      } catch (err) {
        if (gen !== generation) return;
        if (err instanceof Problem && err.status === 404) out.replaceChildren(h("p", { class: "empty" }, missing()));
        else showError(err);
      }
    };
    const key = () => claimForm.elements.key.value;
    const stream = () => streamForm.elements.stream.value;
    claimForm.addEventListener("submit", answer(claimOut, () => `/claims/${seg(key())}`,
      (r) => h("dl", { class: "fields" },
        h("dt", {}, "State"), h("dd", {}, h("span", { class: `badge ${r.state}` }, r.state)),
        h("dt", {}, "Fence"), h("dd", {}, String(r.fence)),
        h("dt", {}, "Expires"), h("dd", {}, time(r.expires_at_ms))),
      () => `No live claim for ${key()}: it was never claimed, was released, or expired.`));
    streamForm.addEventListener("submit", answer(streamOut, () => `/streams/${seg(stream())}`,
      (r) => h("dl", { class: "fields" },
        h("dt", {}, "Head event"), h("dd", {}, r.head.event_id),
        h("dt", {}, "Head created"), h("dd", {}, rfc3339(r.head.created_at))),
      () => `No head for stream ${stream()}: nothing applied to it within ordering.retention.`));
    view.replaceChildren(h("h1", {}, "Lookups"),
      h("section", { "aria-labelledby": "claims-title" }, h("h2", { id: "claims-title" }, "A claim"),
        h("p", { class: "muted" }, "API claims by key (gateway claims live in their own namespace)."), claimForm, claimOut),
      h("section", { "aria-labelledby": "streams-title" }, h("h2", { id: "streams-title" }, "A stream's head"),
        streamForm, streamOut));
  }

  // ---- routing -----------------------------------------------------------

  async function refresh(gen, fn, ...args) {
    if (gen !== generation) return;
    try {
      await fn(gen, ...args);
    } catch (err) {
      showError(err);
      // Keep trying: the server may be restarting.
      const transient = !(err instanceof Problem) || err.status >= 500;
      if (gen === generation && !(err instanceof AuthNeeded) && transient) {
        timer = setTimeout(() => refresh(gen, fn, ...args), OVERVIEW_REFRESH_MS);
      }
    }
  }

  function route() {
    clearTimeout(timer);
    generation += 1;
    const gen = generation;
    const hash = location.hash.replace(/^#/, "") || "/";
    const [path, query] = hash.split("?");
    const params = new URLSearchParams(query || "");
    const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    const section = parts[0] === "lookups" ? "lookups" : "overview";
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === section) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    if (!login.hidden) return;
    if (parts[0] === "lookups") return lookups();
    if (parts[0] === "sources" && parts[2] === "events" && parts.length === 3) {
      return refresh(gen, events, parts[1], params);
    }
    if (parts[0] === "sources" && parts[2] === "events" && parts.length === 4) {
      return refresh(gen, detail, parts[1], parts[3]);
    }
    return refresh(gen, overview);
  }

  window.addEventListener("hashchange", () => {
    route();
    view.focus({ preventScroll: true });
  });
  route();
})();
