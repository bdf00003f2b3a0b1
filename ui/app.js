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
  const JOBS_REFRESH_MS = 1000;
  const STATUSES = ["pending", "delivered", "stale", "dead", "erased", "filtered"];
  /** The statuses each bulk action takes (the API refuses the others). */
  const BULK_STATUSES = {
    redeliver: ["delivered", "dead", "stale"],
    erase: ["pending", "delivered", "dead", "stale", "filtered"],
  };
  const JOB_STATES = ["running", "done", "cancelled"];

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

  /** Calls /v1: `options.json`, if given, is sent as a JSON body. */
  async function api(path, options) {
    const { json, ...rest } = options || {};
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    const init = { ...rest, headers, cache: "no-store" };
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(json);
    }
    const res = await fetch("/v1" + path, init);
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
    // With the shared inbox the breaker, hold and rate limit are the
    // fleet's: every instance shows the same.
    const fleet = d.scope === "fleet" ? " (fleet)" : "";
    if (d.held_by === "store") {
      return h("span", { class: "badge dead", "data-held-by": "store" }, "store unavailable: nothing is delivered");
    }
    if (d.state === "unknown") return h("span", { class: "badge paused" }, "unknown: the fleet's state cannot be read");
    if (d.state === "paused") {
      return h("span", { class: "badge paused", "data-held-by": "paused" }, "paused until ", time(d.paused_until_ms),
        ` after ${d.consecutive_failures} failures${fleet}`);
    }
    if (d.state === "probing") return h("span", { class: "badge paused", "data-held-by": "probing" }, `probing${fleet}`);
    if (d.held_by === "retry_after") {
      return h("span", { class: "badge paused", "data-held-by": "retry_after" },
        "held by Retry-After until ", time(d.held_until_ms), fleet);
    }
    if (d.held_by === "rate_limit") {
      return h("span", { class: "badge running", "data-held-by": "rate_limit" },
        "rate-limited until ", time(d.held_until_ms), `, ${d.in_flight}/${d.max_in_flight} in flight${fleet}`);
    }
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
    if (data.store && data.store.state !== "ready") {
      view.prepend(h("p", { class: "alarm", id: "store-state", role: "status" },
        data.store.state === "disk_low"
          ? "The store's disk is below its watermark: writes are refused, reads served."
          : "The store is unavailable: nothing is taken in or delivered until it answers (see /readyz and the log)."));
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
            : status === "filtered" ? "Every event went to at least one destination."
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
    const bulkLink = h("p", {}, link(`/sources/${seg(source)}/bulk?status=${status}`,
      "Redeliver or erase in bulk…", { id: "bulk-link" }),
    " ", h("span", { class: "muted" }, "(a filter, its count, then a confirmation)"));
    view.replaceChildren(
      h("p", { class: "crumbs" }, link("/", "Sources"), " / ", source),
      h("h1", {}, `${source}: ${status} events`), tabs, orders, bulkLink, body, pager);
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
      timeline(e.timeline, e.trace_id),
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

  // The event's last attempts (the server keeps ten), newest first. With
  // traces on, every attempt is a span of the event's one trace: its id
  // is shown on each, to paste into the tracing backend.
  function timeline(attempts, traceId) {
    if (!attempts || attempts.length === 0) return h("p", { class: "muted", id: "timeline-empty" }, "No attempts yet.");
    const cols = ["#", "Sent", "Status", "Latency", "Error"].concat(traceId ? ["Trace"] : []);
    return h("div", { class: "scroll" }, h("table", { id: "timeline" },
      h("thead", {}, h("tr", {}, cols.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, attempts.slice().reverse().map((a) => h("tr", {},
        h("td", { class: "num" }, String(a.attempt)),
        h("td", {}, time(a.at_ms)),
        h("td", { class: "num" }, a.status === null ? "no answer" : String(a.status)),
        h("td", { class: "num" }, `${a.latency_ms.toFixed(1)} ms`),
        h("td", { class: "error-text" }, a.error || "—"),
        traceId ? h("td", { class: "trace-id" }, h("code", {}, traceId)) : null)))));
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

  // ---- bulk actions and jobs ---------------------------------------------

  /** "1 event", "3 events". */
  function nEvents(n) {
    return `${n} event${n === 1 ? "" : "s"}`;
  }

  /** A filter in words: parts joined by "; ". Times are Unix ms. */
  function describe(f) {
    const parts = [[`status ${f.status}`]];
    if (f.receivedFrom !== null) parts.push(["received from ", time(f.receivedFrom)]);
    if (f.receivedTo !== null) parts.push(["received before ", time(f.receivedTo)]);
    if (f.createdFrom !== null) parts.push(["created from ", time(f.createdFrom)]);
    if (f.createdTo !== null) parts.push(["created before ", time(f.createdTo)]);
    if (f.stream !== null) parts.push([`stream ${f.stream}`]);
    if (f.field !== null) parts.push([`body ${f.field} = ${f.value}`]);
    if (f.error !== null) parts.push([`last error contains “${f.error}”`]);
    return parts.flatMap((p, i) => (i === 0 ? p : ["; ", ...p]));
  }

  const orNull = (v) => (v === undefined || v === null ? null : v);

  /** The filter a job's view holds (as posted: created_at bounds in RFC 3339). */
  function storedFilter(f) {
    const at = (v) => (v === undefined || v === null ? null : Date.parse(v));
    return {
      status: f.status, receivedFrom: orNull(f.received_from), receivedTo: orNull(f.received_to),
      createdFrom: at(f.created_from), createdTo: at(f.created_to), stream: orNull(f.stream),
      field: orNull(f.field), value: orNull(f.value), error: orNull(f.error_contains),
    };
  }

  /** A job's progress in words. */
  function progress(j) {
    const tail = `${j.skipped} skipped; ${j.scanned} read`;
    return j.kind === "erase"
      ? `${j.matched} matched: ${j.erased} erased, ${tail}`
      : `${j.matched} matched: ${j.delivered} delivered, ${j.failed} failed, ${j.queued} in flight, ${tail}`;
  }

  /** Paints `jobs` into `panel`, keeping the focus on a Cancel button it had. */
  function paintJobs(panel, jobs, showSource) {
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.cancel : undefined;
    if (jobs.length === 0) {
      panel.replaceChildren(h("p", { class: "empty", id: "jobs-empty" }, showSource
        ? "No jobs yet. Start one from a source's events: “Redeliver or erase in bulk…”."
        : "No jobs for this source yet."));
      return;
    }
    panel.replaceChildren(h("div", { class: "scroll" }, h("table", { id: "jobs" },
      h("caption", {}, "Newest first (the last 100 are kept); while one runs, its progress refreshes every second."),
      h("thead", {}, h("tr", {}, ["Job", showSource ? "Source" : null, "Action", "State", "Progress", "Filter",
        "Started", "Finished", ""].filter((c) => c !== null).map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, jobs.map((j) => {
        const state = j.state === "running" && j.cancelled ? "cancelling" : j.state;
        const cancel = j.state === "running" && !j.cancelled
          ? h("button", { type: "button", "data-cancel": j.id, "aria-label": `Cancel ${j.id}` }, "Cancel") : null;
        return h("tr", { "data-job": j.id },
          h("td", {}, h("code", {}, j.id)),
          showSource ? h("td", {}, link(`/sources/${seg(j.source)}/events?status=${j.filter ? j.filter.status : "pending"}`, j.source)) : null,
          h("td", {}, j.kind),
          h("td", { "data-state": "" }, h("span", { class: JOB_STATES.includes(j.state) ? `badge ${j.state}` : "badge" }, state)),
          h("td", { "data-progress": "" }, progress(j),
            j.error ? [h("br"), h("span", { class: "error-text" }, j.error)] : null),
          h("td", { class: "filter" }, describe(storedFilter(j.filter))),
          h("td", {}, time(j.created_ms)),
          h("td", {}, j.finished_ms === null ? "—" : time(j.finished_ms)),
          h("td", {}, cancel));
      })))));
    if (focused) {
      const again = panel.querySelector(`button[data-cancel="${CSS.escape(focused)}"]`);
      if (again) again.focus();
    }
  }

  /**
   * Loads the jobs (all, or one source's) into `panel`, and again every
   * second while one of them runs. A later call supersedes an earlier one.
   */
  async function pollJobs(gen, panel, source) {
    clearTimeout(timer);
    panel.poll = (panel.poll || 0) + 1;
    const mine = panel.poll;
    let data;
    try {
      data = await api("/jobs");
    } catch (err) {
      if (gen !== generation || mine !== panel.poll) return;
      showError(err);
      panel.failed = true;
      const transient = !(err instanceof Problem) || err.status >= 500;
      if (!(err instanceof AuthNeeded) && transient) {
        timer = setTimeout(() => pollJobs(gen, panel, source), OVERVIEW_REFRESH_MS);
      }
      return;
    }
    if (gen !== generation || mine !== panel.poll) return;
    if (panel.failed) {
      panel.failed = false;
      clearError();
    }
    const jobs = source === null ? data.jobs : data.jobs.filter((j) => j.source === source);
    paintJobs(panel, jobs, source === null);
    if (jobs.some((j) => j.state === "running")) {
      timer = setTimeout(() => pollJobs(gen, panel, source), JOBS_REFRESH_MS);
    }
  }

  /** A jobs panel: Cancel on a running job cancels it (one click: cancelling undoes nothing). */
  function jobsPanel(gen, source) {
    const panel = h("div", { id: "jobs-panel" }, h("p", { class: "muted" }, "Loading the jobs…"));
    panel.addEventListener("click", async (ev) => {
      const button = ev.target.closest("button[data-cancel]");
      if (!button) return;
      button.disabled = true;
      try {
        await api(`/jobs/${seg(button.dataset.cancel)}/cancel`, { method: "POST" });
        if (gen === generation) pollJobs(gen, panel, source);
      } catch (err) {
        button.disabled = false;
        showError(err);
      }
    });
    pollJobs(gen, panel, source);
    return panel;
  }

  function jobsPage(gen) {
    clearError();
    const panel = jobsPanel(gen, null);
    view.replaceChildren(h("h1", {}, "Jobs"),
      h("p", { class: "muted" }, "Bulk redeliveries and erasures. Start one from a source's events ",
        "(“Redeliver or erase in bulk…”). Cancel stops a job queuing more; it ends once what it queued settled."),
      panel);
  }

  /** What is wrong with the form, said to the operator. */
  class FormError extends Error {}

  /** A datetime-local value (the browser's time zone) as Unix ms; null when empty. */
  function localMs(input, what) {
    if (!input.value) return null;
    const ms = new Date(input.value).getTime();
    if (Number.isNaN(ms)) throw new FormError(`${what}: not a date and time.`);
    return ms;
  }

  // A source's bulk action: a filter, its count (the dry run), then a
  // confirmation that starts the job, and the source's jobs below.
  function bulk(gen, source, params) {
    clearError();
    const base = `/sources/${seg(source)}`;
    let wanted = params.get("status") || "dead";
    const input = (id, attrs) => h("input", { id, name: id, autocomplete: "off", ...attrs });
    const kind = h("select", { id: "bulk-kind", name: "kind" },
      h("option", { value: "redeliver" }, "Redeliver: send them again"),
      h("option", { value: "erase" }, "Erase: delete their bodies and headers"));
    const status = h("select", { id: "bulk-status", name: "status" });
    const fillStatuses = () => {
      const allowed = BULK_STATUSES[kind.value];
      status.replaceChildren(...allowed.map((st) => h("option", { value: st }, st)));
      status.value = allowed.includes(wanted) ? wanted : "dead";
    };
    fillStatuses();
    kind.addEventListener("change", fillStatuses);
    status.addEventListener("change", () => { wanted = status.value; });
    const since = input("bulk-since", { type: "number", min: "0", step: "any", inputmode: "decimal", class: "short" });
    const receivedFrom = input("bulk-received-from", { type: "datetime-local", step: "1" });
    const receivedTo = input("bulk-received-to", { type: "datetime-local", step: "1" });
    const createdFrom = input("bulk-created-from", { type: "datetime-local", step: "1" });
    const createdTo = input("bulk-created-to", { type: "datetime-local", step: "1" });
    const stream = input("bulk-stream", {});
    const field = input("bulk-field", { placeholder: "/type" });
    const value = input("bulk-value", { placeholder: "run.failed" });
    const error = input("bulk-error", { placeholder: "HTTP 503" });
    const count = h("button", { type: "submit", id: "bulk-count", class: "primary" }, "Count");
    const row = (label, labelFor, ...controls) => [
      h("span", { class: "label" }, h("label", { for: labelFor }, label)),
      h("div", { class: "controls" }, controls)];
    const group = (label, ...controls) => {
      const id = `bulk-${label.toLowerCase().replace(/\W+/g, "-")}`;
      return [h("span", { class: "label", id }, label),
        h("div", { class: "controls", role: "group", "aria-labelledby": id }, controls)];
    };
    const form = h("form", { id: "bulk-form", class: "bulk" },
      row("Action", "bulk-kind", kind),
      row("Status", "bulk-status", status),
      group("Received", h("label", {}, "in the last ", since, " hours"), h("span", { class: "muted" }, "or"),
        h("label", {}, "from ", receivedFrom), h("label", {}, "to ", receivedTo)),
      group("Created at", h("label", {}, "from ", createdFrom), h("label", {}, "to ", createdTo)),
      row("Stream", "bulk-stream", stream),
      group("Body field", h("label", {}, "JSON pointer ", field), h("label", {}, "equals ", value)),
      row("Last error contains", "bulk-error", error),
      h("span", {}), h("div", { class: "controls" }, count,
        h("span", { class: "muted" }, "Counting changes nothing; the action starts only after you confirm it.")));
    const result = h("div", { id: "bulk-result", "aria-live": "polite" });
    const panel = jobsPanel(gen, source);

    /** Bumped on every change of the form: a count answers only the form it was asked for. */
    let version = 0;
    let counted = false;
    const changed = () => {
      version += 1;
      if (counted) {
        counted = false;
        result.replaceChildren(h("p", { class: "muted", id: "bulk-stale" }, "The filter changed: count again."));
      }
    };
    form.addEventListener("input", changed);
    form.addEventListener("change", changed);

    /** The filter the form says, with "in the last N hours" from the server's clock `now`. */
    const read = (now) => {
      const text = (el) => (el.value === "" ? null : el.value);
      const f = {
        status: status.value, receivedFrom: null, receivedTo: localMs(receivedTo, "Received to"),
        createdFrom: localMs(createdFrom, "Created from"), createdTo: localMs(createdTo, "Created to"),
        stream: text(stream), field: field.value.trim() === "" ? null : field.value.trim(),
        value: text(value), error: text(error),
      };
      const from = localMs(receivedFrom, "Received from");
      if (since.value !== "") {
        const hours = Number(since.value);
        if (!(hours > 0)) throw new FormError("Received in the last … hours: a number above 0.");
        if (from !== null) throw new FormError("Received: give “in the last … hours” or a from time, not both.");
        f.receivedFrom = Math.floor(now - hours * 3600 * 1000);
      } else {
        f.receivedFrom = from;
      }
      // Without an end, the events received up to the count: the job
      // touches what was counted, not what arrives before the confirmation.
      if (f.receivedTo === null) f.receivedTo = now + 1;
      if (f.receivedFrom !== null && f.receivedFrom >= f.receivedTo) throw new FormError("Received: the range is empty.");
      if (f.createdFrom !== null && f.createdTo !== null && f.createdFrom >= f.createdTo) {
        throw new FormError("Created at: the range is empty.");
      }
      if ((f.field === null) !== (f.value === null)) throw new FormError("Body field: give a JSON pointer and a value, or neither.");
      if (f.field !== null && !f.field.startsWith("/")) throw new FormError("Body field: a JSON pointer starts with / (such as /type).");
      return f;
    };

    /** The filter as the API takes it (a count's query, a job's JSON). */
    const wire = (f) => {
      const w = { status: f.status };
      if (f.receivedFrom !== null) w.received_from = f.receivedFrom;
      if (f.receivedTo !== null) w.received_to = f.receivedTo;
      if (f.createdFrom !== null) w.created_from = new Date(f.createdFrom).toISOString();
      if (f.createdTo !== null) w.created_to = new Date(f.createdTo).toISOString();
      if (f.stream !== null) w.stream = f.stream;
      if (f.field !== null) {
        w.field = f.field;
        w.value = f.value;
      }
      if (f.error !== null) w.error_contains = f.error;
      return w;
    };

    form.addEventListener("submit", async (ev) => {
      ev.preventDefault();
      const asked = version;
      count.disabled = true;
      try {
        const now = (await api("/sources")).now_ms;
        const f = read(now);
        const filter = wire(f);
        const query = new URLSearchParams(Object.entries(filter).map(([k, v]) => [k, String(v)]));
        // A count stops at the server's scan budget and says where to go
        // on from: follow it (up to 100 answers), adding the answers up.
        let c = await api(`${base}/count?${query}`);
        for (let pages = 1; !c.complete && c.next && pages < 100; pages++) {
          if (gen !== generation || asked !== version) break;
          const more = await api(`${base}/count?${query}&after=${encodeURIComponent(c.next)}`);
          c = {
            matched: c.matched + more.matched,
            scanned: c.scanned + more.scanned,
            complete: more.complete,
            next: more.next,
            first_ids: c.first_ids.concat(more.first_ids).slice(0, 10),
          };
        }
        if (gen !== generation) return;
        if (asked !== version) {
          result.replaceChildren(h("p", { class: "muted", id: "bulk-stale" }, "The filter changed while counting: count again."));
          return;
        }
        clearError();
        showCount(kind.value, f, filter, c);
      } catch (err) {
        if (gen !== generation) return;
        if (err instanceof FormError) {
          counted = false;
          result.replaceChildren(h("p", { class: "error", id: "bulk-invalid" }, err.message));
        } else {
          showError(err);
        }
      } finally {
        count.disabled = false;
      }
    });

    /** The count, and the confirmation of exactly the filter counted. */
    function showCount(action, f, filter, c) {
      counted = true;
      const n = c.matched;
      const ids = c.first_ids.map((id) => link(`${base}/events/${seg(id)}`, id));
      const said = h("p", { id: "bulk-count-text" },
        n === 0 ? "No events match."
          : [c.complete ? "" : "At least ", `${nEvents(n)} match`, n === 1 && c.complete ? "es" : "",
            " (first ids: ", ids.flatMap((a, i) => (i === 0 ? [a] : [", ", a])), n > ids.length ? ", …" : "", ")."]);
      const parts = [said, h("p", { class: "muted", id: "bulk-filter" }, "Filter: ", describe(f),
        c.complete ? `. ${c.scanned} ${f.status} events read.`
          : `. The count stopped after reading ${c.scanned} events: more may match.`)];
      if (n === 0) {
        result.replaceChildren(...parts);
        return;
      }
      const go = h("button", { type: "button", id: "bulk-confirm", class: action === "erase" ? "danger" : "primary" },
        `${action === "erase" ? "Erase" : "Redeliver"} ${nEvents(n)}`);
      let ask;
      if (action === "erase") {
        const check = h("input", { id: "bulk-erase-check", autocomplete: "off", inputmode: "numeric", class: "short" });
        go.disabled = true;
        check.addEventListener("input", () => { go.disabled = check.value.trim() !== String(n); });
        ask = h("div", { class: "confirm danger-zone", role: "group", "aria-labelledby": "bulk-erase-text" },
          h("p", { id: "bulk-erase-text" }, h("strong", {}, "Erasing cannot be undone. "),
            `The body and stored headers of each of these ${nEvents(n)} are deleted for good; `,
            "the records stay, listed as erased, so a late retry of one is still a duplicate.",
            f.status === "pending" ? " Pending events erased are never delivered." : ""),
          h("p", {}, h("label", { for: "bulk-erase-check" }, `Type ${n}, the number of events, to confirm: `), check),
          go);
      } else {
        ask = h("div", { class: "confirm", role: "group", "aria-labelledby": "bulk-redeliver-text" },
          h("p", { id: "bulk-redeliver-text" }, `Send these ${nEvents(n)} again to ${source}'s forward_to? `,
            "Each carries a dedupd-replay header naming the job, and its attempts count on; ",
            "the job uses at most half the source's delivery slots."), go);
      }
      parts.push(ask);
      result.replaceChildren(...parts);
      go.addEventListener("click", async () => {
        if (go.disabled) return;
        go.disabled = true;
        try {
          const job = await api(`${base}/jobs`, { method: "POST", json: { kind: action, filter } });
          if (gen !== generation) return;
          counted = false;
          result.replaceChildren(h("p", { class: "notice", role: "status", id: "bulk-started" },
            `Started ${job.id}: ${action} of the ${nEvents(n)} counted. Its progress is in the jobs below.`));
          pollJobs(gen, panel, source);
        } catch (err) {
          go.disabled = false;
          showError(err);
        }
      });
      (action === "erase" ? ask.querySelector("input") : go).focus();
    }

    view.replaceChildren(
      h("p", { class: "crumbs" }, link("/", "Sources"), " / ", link(`${base}/events?status=${status.value}`, source), " / bulk"),
      h("h1", {}, `${source}: redeliver or erase in bulk`),
      h("p", { class: "muted" }, "Say which events; Count shows how many match and the first ids. ",
        "Only then can you start the action, for exactly the events counted (received up to the count)."),
      form, result,
      h("h2", {}, `Jobs of ${source}`), panel);
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
    const section = parts[0] === "lookups" || parts[0] === "jobs" ? parts[0] : "overview";
    for (const a of document.querySelectorAll("[data-nav]")) {
      if (a.dataset.nav === section) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    if (!login.hidden) return;
    if (parts[0] === "lookups") return lookups();
    if (parts[0] === "jobs") return jobsPage(gen);
    if (parts[0] === "sources" && parts[2] === "bulk" && parts.length === 3) {
      return bulk(gen, parts[1], params);
    }
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
