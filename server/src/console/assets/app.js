// Kairos console: vanilla JS, DOM built node by node. Server strings (job
// ids, errors, results) only ever reach the page as text nodes, never as
// HTML. Every POST carries X-Kairos-Action (the server refuses it otherwise).
"use strict";

const main = document.getElementById("main");
const SVG = "http://www.w3.org/2000/svg";
let current = null; // { name, arg, refresh } of the page shown
let refreshTimer = null;

// el("td", {class: "x", onclick: f}, "text", child) -> element.
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function table(headers, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, ...headers.map(h => el("th", {}, h)))), el("tbody", {}, ...rows));
}

function time(ms) {
  if (!ms) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

function showError(msg) {
  const box = document.getElementById("error");
  box.textContent = msg || "";
  box.hidden = !msg;
}

class AuthNeeded extends Error {}

async function api(path, opts = {}) {
  const headers = { Accept: "application/json" };
  if (opts.method === "POST") headers["X-Kairos-Action"] = "1";
  const r = await fetch(path, { credentials: "same-origin", method: opts.method || "GET", headers, body: opts.body });
  let body = {};
  try { body = await r.json(); } catch (_) { body = { error: "HTTP " + r.status }; }
  if (r.status === 401) throw new AuthNeeded(body.error);
  if (!r.ok) throw new Error(body.error || "HTTP " + r.status);
  return body;
}

function link(hash, text) {
  return el("a", { href: hash }, text);
}

function jobLink(id) {
  return link("#/job/" + encodeURIComponent(id), id);
}

// ---------------------------------------------------------------- pages

async function clusterPage() {
  const s = await api("/api/cluster");
  const rows = s.nodes.map(n => el("tr", { "data-node": n.id, class: n.id === s.leader ? "leader" : null },
    el("td", {}, n.id),
    el("td", { class: "role" }, n.role),
    el("td", {}, n.voter ? "voter" : "learner"),
    el("td", { class: "mono" }, n.addr),
    el("td", { class: "applied" }, n.applied_index),
    el("td", {}, n.term),
    el("td", { class: "mono digest", title: n.state_digest },
      (n.state_digest || "-").slice(0, 16) +
      (n.state_digest && n.digest_index !== n.applied_index ? " (at " + n.digest_index + ")" : "")),
    el("td", { class: "skew" }, n.clock_offset_ms + " ms"),
    el("td", {}, n.lag),
    el("td", {}, n.tzdata || "-"),
    el("td", { class: "err" }, n.refusal)));
  return [
    el("h1", {}, "Cluster"),
    el("p", {}, "Leader: ", el("strong", { id: "cluster-leader" }, s.leader || "none"),
      " · answered by node ", s.answered_by, " · log format ", s.log_format,
      s.membership_changing ? " · membership change in progress" : "",
      s.auth ? "" : " · open (no tokens configured)"),
    table(["node", "role", "vote", "address", "applied", "term", "state digest", "clock skew", "lag", "tzdata", "refusal"], rows),
  ];
}

function jobsQuery(params) {
  const q = new URLSearchParams();
  for (const k of ["prefix", "group", "selector", "state", "page_token"]) if (params.get(k)) q.set(k, params.get(k));
  return q;
}

async function jobsPage(params) {
  const q = jobsQuery(params);
  q.set("page_size", "50");
  const r = await api("/api/jobs?" + q);
  const go = (extra) => {
    const next = jobsQuery(new URLSearchParams(Object.entries(extra)));
    location.hash = "#/jobs?" + next;
  };
  const prefix = el("input", { name: "prefix", id: "filter-prefix", value: params.get("prefix") || "", maxlength: 128 });
  const group = el("input", { name: "group", id: "filter-group", value: params.get("group") || "", maxlength: 128 });
  const selector = el("input", { name: "selector", id: "filter-selector", value: params.get("selector") || "", maxlength: 256, placeholder: "k=v,k2=v2" });
  const state = el("select", { name: "state", id: "filter-state" },
    ...["all", "active", "paused", "finished"].map(s => el("option", { value: s, selected: (params.get("state") || "all") === s }, s)));
  const form = el("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    go({ prefix: prefix.value, group: group.value, selector: selector.value, state: state.value === "all" ? "" : state.value });
  } },
  el("label", {}, "id prefix", prefix), el("label", {}, "group", group), el("label", {}, "labels", selector), el("label", {}, "state", state),
  el("button", { type: "submit", id: "filter-apply" }, "Filter"));
  const rows = r.jobs.map(j => el("tr", { "data-job": j.id },
    el("td", { class: "mono" }, jobLink(j.id)),
    el("td", {}, j.group),
    el("td", { class: "mono" }, schedulesText(j)),
    el("td", { class: "state state-" + j.state }, j.state),
    el("td", {}, time(j.next_fire_at_ms))));
  const more = r.next_page_token
    ? el("button", { id: "next-page", onclick: () => go({ prefix: params.get("prefix") || "", group: params.get("group") || "", selector: params.get("selector") || "", state: params.get("state") || "", page_token: r.next_page_token }) }, "Next page")
    : null;
  return [el("h1", {}, "Jobs"), form, table(["id", "group", "schedule", "state", "next fire (UTC)"], rows),
    r.jobs.length ? null : el("p", { id: "no-jobs" }, "No jobs match."), more];
}

// A job's schedule and its also_schedules, joined.
function schedulesText(j) {
  return [j.schedule].concat(j.also_schedules || []).map(scheduleText).join("; ");
}

function scheduleText(s) {
  if (!s) return "-";
  if (s.cron !== undefined) return "cron " + s.cron + (s.tz ? " " + s.tz : "");
  if (s.every_ms !== undefined) return "every " + s.every_ms + " ms";
  if (s.at_ms !== undefined) return "at " + time(s.at_ms);
  if (s.upstream_only) return "when its upstreams complete a cycle";
  return "after " + s.after_ms + " ms";
}

async function act(what, path, after) {
  if (!window.confirm(what + "?")) return;
  try {
    await api(path, { method: "POST" });
    showError("");
  } catch (e) {
    showError(what + ": " + e.message);
  }
  after();
}

function runRow(r) {
  const finished = ["succeeded", "failed", "timed_out", "cancelled"].includes(r.state);
  const retry = finished
    ? el("button", { class: "retry", onclick: () => act("Retry run " + r.run_id, "/api/runs/retry?run_id=" + encodeURIComponent(r.run_id), refresh) }, "Retry")
    : null;
  return el("tr", { "data-run": r.run_id },
    el("td", { class: "mono" }, r.run_id),
    el("td", {}, time(r.scheduled_at_ms)),
    el("td", { class: "state state-" + r.state }, r.state),
    el("td", { class: "attempt" }, r.attempt),
    el("td", { class: "mono" }, r.worker || "-"),
    el("td", { class: "mono" }, r.result),
    el("td", { class: "err" }, r.error),
    el("td", {}, r.note),
    el("td", {}, retry));
}

const RUN_HEADERS = ["run", "scheduled (UTC)", "state", "attempt", "worker", "result", "error", "note", ""];

// Lateness (fired - scheduled) of the recent runs, oldest left, as SVG bars.
function latenessChart(runs) {
  const late = runs.filter(r => r.fired_at_ms).map(r => Math.max(0, r.fired_at_ms - r.scheduled_at_ms - r.offset_ms)).reverse();
  const w = 400, h = 80, max = Math.max(1, ...late);
  const svg = document.createElementNS(SVG, "svg");
  for (const [k, v] of Object.entries({ class: "chart", id: "lateness-chart", width: w, height: h + 16, viewBox: `0 0 ${w} ${h + 16}` })) svg.setAttribute(k, v);
  const bw = late.length ? w / late.length : w;
  late.forEach((ms, i) => {
    const bar = document.createElementNS(SVG, "rect");
    const bh = Math.max(1, (ms / max) * h);
    for (const [k, v] of Object.entries({ x: i * bw + 1, y: h - bh, width: Math.max(1, bw - 2), height: bh })) bar.setAttribute(k, v);
    const title = document.createElementNS(SVG, "title");
    title.textContent = ms + " ms late";
    bar.append(title);
    svg.append(bar);
  });
  const label = document.createElementNS(SVG, "text");
  for (const [k, v] of Object.entries({ x: 2, y: h + 13, "font-size": 11 })) label.setAttribute(k, v);
  label.textContent = `lateness of the last ${late.length} fired runs, max ${max} ms`;
  svg.append(label);
  return svg;
}

async function jobPage(id) {
  const enc = encodeURIComponent(id);
  const [d, recent] = await Promise.all([api("/api/jobs/" + enc), api("/api/jobs/" + enc + "/runs?count=20")]);
  const j = d.job, s = d.stats;
  const back = () => { location.hash = "#/jobs"; };
  const spec = el("dl", { class: "spec", id: "job-spec" });
  const fields = [["group", j.group], ["schedule", schedulesText(j)], ["state", j.state + (j.paused && j.pause_note ? " — " + j.pause_note : "")],
    ["revision", j.revision], ["created", time(j.created_at_ms)], ["updated", time(j.updated_at_ms)],
    ["jitter", j.jitter_ms ? j.jitter_ms + " ms (next occurrence +" + j.next_offset_ms + " ms)" : "-"],
    ["misfire", j.misfire + " (grace " + j.misfire_grace_ms + " ms)"], ["timeout", j.timeout_ms + " ms"],
    ["attempts", j.max_attempts + " (backoff " + j.backoff_ms + " ms)"], ["priority", j.priority],
    ["overlap", j.overlap + (j.max_concurrent ? " (max " + j.max_concurrent + " concurrent)" : "") + (j.queued_at_ms.length ? ", " + j.queued_at_ms.length + " queued" : "")], ["route", j.route], ["job labels", JSON.stringify(j.job_labels)], ["route labels", JSON.stringify(j.labels)],
    ["bounds", [j.start_at_ms ? "from " + time(j.start_at_ms) : "", j.end_at_ms ? "until " + time(j.end_at_ms) : "", j.max_runs ? "max " + j.max_runs + " runs" : ""].filter(x => x).join(", ") || "-"],
    ["fired", j.fired_count],
    ["backfill", j.backfill ? j.backfill.state + " [" + time(j.backfill.from_ms) + ", " + time(j.backfill.to_ms) + ") " + j.backfill.overlap + ": " + (j.backfill.started + j.backfill.existing + j.backfill.skipped) + " of " + j.backfill.total : "-"],
    ["shards", j.shards ?? "-"], ["broadcast", j.broadcast], ["payload", j.payload_bytes + " bytes"],
    ["keep runs", j.keep_runs || "default"], ["keep for", j.keep_for_ms ? j.keep_for_ms + " ms" : "-"],
    ["upstream", j.upstream.length ? j.upstream.join(", ") + " (" + j.trigger_rule + ", on failure " + j.on_upstream_failure + ")" : "-"],
    ["workflow state", j.workflow_state || "-"], ["downstream", j.downstream.length ? j.downstream.join(", ") : "-"]];
  for (const [k, v] of fields) spec.append(el("dt", {}, k), el("dd", { "data-field": k }, v));
  const stats = el("dl", { class: "spec", id: "job-stats" });
  for (const k of ["runs", "fired", "succeeded", "failed", "timed_out", "cancelled", "skipped", "active", "lateness_ms_p50", "lateness_ms_p99"]) {
    stats.append(el("dt", {}, k), el("dd", { "data-stat": k }, s[k]));
  }
  const actions = el("div", { class: "actions" },
    j.paused
      ? el("button", { id: "action-resume", onclick: () => act("Resume job " + id, `/api/jobs/${enc}/resume`, refresh) }, "Resume")
      : el("button", { id: "action-pause", onclick: () => act("Pause job " + id, `/api/jobs/${enc}/pause`, refresh) }, "Pause"),
    el("button", { id: "action-trigger", onclick: () => act("Trigger job " + id + " now", `/api/jobs/${enc}/trigger`, refresh) }, "Trigger now"),
    el("button", { id: "action-delete", onclick: () => act("Delete job " + id, `/api/jobs/${enc}/delete`, back) }, "Delete"));
  return [
    el("h1", {}, "Job ", el("span", { class: "mono", id: "job-id" }, j.id)),
    actions,
    el("div", { class: "cols" },
      el("section", {}, el("h2", {}, "Spec"), spec),
      el("section", {}, el("h2", {}, "Statistics"), stats),
      el("section", {}, el("h2", {}, j.paused ? "Next fires if resumed (UTC)" : "Next fires (UTC)"), el("ol", { id: "next-fires" }, ...d.next_fires.map(t => el("li", {}, time(t))))),
      el("section", {}, el("h2", {}, "Lateness"), latenessChart(recent.runs))),
    el("h2", {}, "Recent runs", recent.truncated ? " (history longer than scanned)" : ""),
    table(RUN_HEADERS, recent.runs.map(runRow)),
  ];
}

const SINCE = { "15m": 15 * 60e3, "1h": 3600e3, "24h": 24 * 3600e3, "all": 0 };

async function runsPage(params) {
  const state = params.get("state") || "failed", since = params.get("since") || "1h";
  const q = new URLSearchParams({ page_size: "50" });
  if (state !== "all") q.set("state", state);
  if (SINCE[since]) q.set("since_ms", String(Date.now() - SINCE[since]));
  if (params.get("group")) q.set("group", params.get("group"));
  if (params.get("page_token")) q.set("page_token", params.get("page_token"));
  const r = await api("/api/runs?" + q);
  const stateSel = el("select", { id: "runs-state" },
    ...["all", "pending", "running", "succeeded", "failed", "timed_out", "skipped", "cancelled"].map(s => el("option", { value: s, selected: s === state }, s)));
  const sinceSel = el("select", { id: "runs-since" }, ...Object.keys(SINCE).map(s => el("option", { value: s, selected: s === since }, s)));
  const group = el("input", { id: "runs-group", value: params.get("group") || "", maxlength: 128 });
  const go = (token) => {
    const p = new URLSearchParams({ state: stateSel.value, since: sinceSel.value });
    if (group.value) p.set("group", group.value);
    if (token) p.set("page_token", token);
    location.hash = "#/runs?" + p;
  };
  const form = el("form", { class: "filters", onsubmit: (e) => { e.preventDefault(); go(""); } },
    el("label", {}, "state", stateSel), el("label", {}, "finished in the last", sinceSel), el("label", {}, "group", group),
    el("button", { type: "submit", id: "runs-apply" }, "Show"));
  const rows = r.runs.map(run => {
    const row = runRow(run);
    row.firstChild.replaceChildren(jobLink(run.job), " ", run.run_id.slice(run.job.length));
    return row;
  });
  return [el("h1", {}, "Runs across jobs"), form, table(RUN_HEADERS, rows),
    r.runs.length ? null : el("p", { id: "no-runs" }, "No runs match."),
    r.next_page_token ? el("button", { id: "next-page", onclick: () => go(r.next_page_token) }, "Next page") : null];
}

function loginPage(reason) {
  const input = el("input", { type: "password", id: "token", size: 60, autocomplete: "off" });
  const form = el("form", { class: "filters", onsubmit: async (e) => {
    e.preventDefault();
    try {
      await api("/api/login", { method: "POST", body: new URLSearchParams({ token: input.value }) });
      showError("");
      startLive();
      route();
    } catch (err) {
      showError("Login: " + err.message);
    }
  } }, el("label", {}, "token (role reader or above)", input), el("button", { type: "submit", id: "login-btn" }, "Open"));
  return [el("h1", {}, "Kairos"), el("p", {}, reason || "This cluster needs a token."), form];
}

// ---------------------------------------------------------------- routing

function parseHash() {
  const h = location.hash.replace(/^#\/?/, "");
  const [path, query] = h.split("?");
  const parts = path.split("/");
  return { name: parts[0] || "cluster", arg: parts.slice(1).join("/"), params: new URLSearchParams(query || "") };
}

async function route() {
  const r = parseHash();
  current = r;
  // Test hooks: which route is shown, and whether it finished rendering.
  document.body.dataset.page = r.name;
  document.body.dataset.hash = location.hash;
  document.body.dataset.ready = "0";
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.id === "nav-" + r.name || (r.name === "job" && a.id === "nav-jobs"));
  let nodes;
  try {
    if (r.name === "jobs") nodes = await jobsPage(r.params);
    else if (r.name === "job") nodes = await jobPage(decodeURIComponent(r.arg));
    else if (r.name === "runs") nodes = await runsPage(r.params);
    else nodes = await clusterPage();
    document.getElementById("logout").hidden = false;
  } catch (e) {
    if (e instanceof AuthNeeded) nodes = loginPage(e.message);
    else nodes = [el("h1", {}, "Error"), el("p", { class: "err", id: "page-error" }, e.message)];
  }
  if (current !== r) return; // Another route started meanwhile.
  main.replaceChildren(...nodes.filter(n => n));
  document.body.dataset.ready = "1";
}

function refresh() {
  route();
}

// Coalesces watch events into one refresh of the page shown.
function scheduleRefresh(delayMs) {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; refresh(); }, delayMs);
}

function affects(ev) {
  const r = current;
  if (!r) return false;
  if (r.name === "job") return ev.job === decodeURIComponent(r.arg);
  return true;
}

// ---------------------------------------------------------------- live updates

let source = null;

function startLive() {
  if (source) source.close();
  const live = document.getElementById("live");
  source = new EventSource("/api/watch");
  source.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  source.onerror = () => { live.textContent = "reconnecting"; live.className = "live off"; };
  source.onmessage = (m) => {
    const ev = JSON.parse(m.data);
    document.getElementById("last-event").textContent = `#${ev.index} ${ev.kind} ${ev.job}`;
    if (affects(ev)) scheduleRefresh(current && current.name === "cluster" ? 1000 : 200);
  };
  source.addEventListener("watch_error", (m) => {
    showError("watch: " + JSON.parse(m.data).error);
  });
}

document.getElementById("logout").addEventListener("click", async () => {
  await api("/api/logout", { method: "POST" });
  if (source) source.close();
  route();
});
window.addEventListener("hashchange", route);
startLive();
route();
