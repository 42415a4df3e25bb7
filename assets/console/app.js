// Palisade's analyst console: one page over the /v1 API. The token lives in session
// storage only (never in a URL); every value from the API is put into the page as text
// (textContent and text nodes only), so an account name cannot inject markup.
"use strict";

const TOKEN_KEY = "palisade.token";
const view = () => document.getElementById("view");

// ---- DOM helpers -------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function table(caption, columns, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty || "Nothing to show.");
  return h("div", { class: "table-wrap" },
    h("table", {},
      h("caption", { class: "visually-hidden" }, caption),
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c, i) => {
        const cell = c instanceof Node && c.tagName === "TD" ? c : h("td", {}, c);
        if (columns[i]) cell.dataset.label = columns[i];
        return cell;
      }))))));
}

function num(value) { return h("td", { class: "num" }, value); }
// Every time on the page is UTC, written one way, zone included: "2026-12-07 01:23:45 UTC".
function utc(t) {
  return new Date(t).toISOString().slice(0, 19).replace("T", " ") + " UTC";
}
function when(rfc3339) {
  if (!rfc3339) return "";
  return h("time", { datetime: rfc3339, title: rfc3339 }, utc(rfc3339));
}
function accountLink(account) { return h("a", { href: "#/account/" + encodeURIComponent(account) }, account); }
function ipLink(ip) { return h("a", { href: "#/ip/" + encodeURIComponent(ip) }, ip); }

// A failure of a view or of a click, said in words: an unreachable service is not a
// "Failed to fetch".
function failed(err) {
  if (err.status === 401) return signOut("Your token is no longer valid: sign in again.");
  say(err.status ? err.message : "Palisade unreachable: check that the service is running, then try again.", "error");
}

// A click handler's failure, shown like a view's.
function guarded(handler) {
  return async (...args) => {
    try {
      await handler(...args);
    } catch (err) {
      failed(err);
    }
  };
}

// The message line sits at the top of the window (sticky), so a message is never scrolled
// out of view.
function say(text, kind) {
  const status = document.getElementById("status");
  status.replaceChildren(text ? h("p", { class: kind || "info" }, text) : "");
}

function show(title, ...content) {
  document.title = title + " · Palisade console";
  view().replaceChildren(h("h1", {}, title), ...content);
}

// ---- API ---------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    const error = (body && body.error) || {};
    super(error.message || "HTTP " + status);
    this.status = status;
    this.code = error.code;
  }
}

async function api(method, path, body) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  // A network failure rejects with a TypeError: no status, said as "unreachable".
  const response = await fetch(path, {
    method,
    headers: Object.assign({ Authorization: "Bearer " + token },
      body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
    cache: "no-store",
  });
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== "" && v !== undefined && v !== null) q.set(k, v);
  const text = q.toString();
  return text ? "?" + text : "";
}

// ---- Sign in -----------------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_KEY);
  // No hashchange event: the sign-in page replaces whatever view was open.
  history.replaceState(null, "", "#/");
  signInView();
  say(message || "", "error");
}

function signInView() {
  for (const id of ["nav", "lookup", "signout"]) document.getElementById(id).hidden = true;
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const form = h("form", { class: "card signin", onsubmit: async (e) => {
    e.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    try {
      await api("GET", "/v1/lockouts?limit=1");
      say("");
      render();
    } catch (err) {
      sessionStorage.removeItem(TOKEN_KEY);
      if (!err.status) return failed(err);
      say(err.status === 403 ? "This token is not an analyst token." : "Sign-in failed: " + err.message, "error");
    }
  } },
  h("h1", {}, "Sign in"),
  h("p", { class: "muted" }, "Use an analyst (or admin) API token. It is kept in this tab's session storage only."),
  h("div", { class: "field" }, h("label", { for: "token" }, "API token"), input),
  h("button", { type: "submit" }, "Sign in"));
  document.title = "Sign in · Palisade console";
  view().replaceChildren(form);
  input.focus();
}

// ---- Views -------------------------------------------------------------------------

// A class's decisions over the window as stacked bars (refused over allowed), drawn to the
// card's width, with a count axis, a UTC time axis and a tooltip per point.
const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  el.append(...children);
  return el;
}

function hhmm(t) { return new Date(t).toISOString().slice(11, 16); }

function chart(series, stepS) {
  const [W, H, left, top, bottom] = [320, 120, 30, 6, 18];
  const plotW = W - left - 4, plotH = H - top - bottom;
  const points = series.points;
  const max = Math.max(1, ...points.map((p) => p.allowed + p.limited));
  const slot = plotW / Math.max(1, points.length);
  const y = (v) => top + plotH - (v / max) * plotH;
  const root = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `${series.class}: ${series.limited} refused of ${series.allowed + series.limited}, ` +
      `${utc(points[0].at)} to ${utc(Date.parse(points[points.length - 1].at) + stepS * 1000)}` });
  root.append(
    svg("line", { class: "axis", x1: left, y1: top + plotH, x2: W - 4, y2: top + plotH }),
    svg("line", { class: "grid", x1: left, y1: top, x2: W - 4, y2: top }),
    svg("text", { class: "tick", x: left - 4, y: top + 8, "text-anchor": "end" }, String(max)),
    svg("text", { class: "tick", x: left - 4, y: top + plotH, "text-anchor": "end" }, "0"));
  points.forEach((p, i) => {
    const x = left + i * slot;
    const end = Date.parse(p.at) + stepS * 1000;
    const group = svg("g", { class: "point" },
      svg("title", {}, `${hhmm(p.at)}–${hhmm(end)} UTC: ${p.allowed} allowed, ${p.limited} refused`),
      // The whole slot answers to the pointer, not only the bar.
      svg("rect", { class: "hit", x, y: top, width: slot, height: plotH }));
    const bar = Math.max(1, slot - 1);
    if (p.allowed + p.limited > 0) {
      group.append(svg("rect", { class: "allowed", x, width: bar, y: y(p.allowed + p.limited),
        height: y(0) - y(p.allowed + p.limited) }));
    }
    if (p.limited > 0) {
      group.append(svg("rect", { class: "limited", x, width: bar, y: y(p.limited), height: y(0) - y(p.limited) }));
    }
    root.append(group);
  });
  // Start, middle and end of the window on the time axis.
  const last = Date.parse(points[points.length - 1].at) + stepS * 1000;
  const first = Date.parse(points[0].at);
  [[first, left, "start"], [(first + last) / 2, left + plotW / 2, "middle"], [last, left + plotW, "end"]].forEach(
    ([t, x, anchor]) => root.append(svg("text", { class: "tick time", x, y: H - 4, "text-anchor": anchor },
      hhmm(t) + (anchor === "end" ? " UTC" : ""))));
  return root;
}

function classCard(c, stepS) {
  const total = c.allowed + c.limited;
  if (!total) {
    return h("div", { class: "card rate", "data-class": c.class }, h("strong", {}, c.class), " ",
      h("span", { class: "badge" }, "no traffic"),
      h("p", { class: "muted empty" }, "No requests in this window."));
  }
  return h("div", { class: "card rate", "data-class": c.class },
    h("strong", {}, c.class), " ",
    h("span", { class: "badge " + (c.block_rate > 0.2 ? "bad" : c.block_rate > 0 ? "warn" : "ok") },
      (c.block_rate * 100).toFixed(1) + "% refused"),
    chart(c, stepS),
    h("div", { class: "legend" }, h("span", { class: "swatch allowed" }), " allowed ",
      h("span", { class: "swatch limited" }), " refused · ", `${c.limited} refused of ${total}`));
}

async function overviewView(params) {
  const window = params.get("window") === "day" ? "day" : "hour";
  const [active, notYet, alerts, offenders, rates, guard] = await Promise.all([
    api("GET", "/v1/lockouts?limit=500"),
    api("GET", "/v1/accounts/failing?locked=false&limit=10"),
    api("GET", "/v1/alerts?limit=10"),
    api("GET", "/v1/offenders?limit=10"),
    api("GET", "/v1/stats/decisions?window=" + window),
    api("GET", "/v1/login-guard"),
  ]);
  const activeCount = active.items.length + (active.next_cursor ? "+" : "");
  show("Overview",
    h("div", { class: "cards" },
      h("div", { class: "card" }, h("div", { class: "muted" }, "Active lockouts"),
        h("div", { class: "big", id: "active-count" }, activeCount), h("a", { href: "#/lockouts" }, "Review lockouts")),
      h("div", { class: "card" }, h("div", { class: "muted" }, "Failing, not locked (24 h)"),
        h("div", { class: "big" }, notYet.items.length === 10 ? "10+" : notYet.items.length),
        h("a", { href: "#/failing" }, "See who")),
      h("div", { class: "card" }, h("div", { class: "muted" }, "Alerts (latest)"),
        h("div", { class: "big" }, alerts.items.length), h("a", { href: "#/alerts" }, "Open alerts")),
      guardCard(guard)),
    h("h2", {}, "Block rate per class, last " + window + " (this instance)"),
    h("p", { class: "window" }, "Window: ",
      h("a", { href: "#/?window=hour", "aria-current": window === "hour" ? "true" : null }, "last hour"), " ",
      h("a", { href: "#/?window=day", "aria-current": window === "day" ? "true" : null }, "last day"),
      h("span", { class: "muted" }, ` · one bar per ${rates.step_s / 60} min`)),
    h("div", { class: "cards wide" }, rates.classes.map((c) => classCard(c, rates.step_s))),
    h("h2", {}, "Top offenders"),
    table("Top offenders", ["Key", "Refusals", "Tightened until"], offenders.items.map((o) => [
      subjectLink(o.key), num(o.count), when(o.tightened_until)]), "No repeat offenders."),
    h("h2", {}, "Latest alerts"),
    alertsTable(alerts.items));
}

// The login guard: on or off and until when, the failures from unknown contexts against
// the threshold in force (learned from this hour of the day's normal, or the first days'
// floor) and the window's logins; an analyst turns it off for a while, with a reason.
function guardCard(guard) {
  const basis = guard.learned
    ? `${guard.surge_factor}× this hour's normal of ${guard.normal.toFixed(1)}`
    : `at least ${guard.min_failures}, ${Math.round(guard.failure_share * 100)}% of logins (normal not learned yet)`;
  const reason = h("input", { id: "guard-reason", placeholder: "Why (kept in the audit log)", "aria-label": "Reason for turning the guard off" });
  const hours = h("select", { id: "guard-for", "aria-label": "For how long" },
    [[3600, "1 hour"], [4 * 3600, "4 hours"], [86400, "24 hours"]].map(([s, label]) => h("option", { value: s }, label)));
  const release = guarded(async () => {
    if (!reason.value.trim()) { say("Give a reason for turning the guard off.", "error"); reason.focus(); return; }
    const answer = await api("POST", "/v1/login-guard/release", { reason: reason.value.trim(), for_s: Number(hours.value) });
    say("The login guard is off until " + utc(answer.released_until) + ".");
    render();
  });
  return h("div", { class: "card", id: "guard" }, h("div", { class: "muted" }, "Login guard"),
    h("div", { class: "big", id: "guard-state" }, guard.active ? "on" : "off"),
    guard.active ? h("div", { id: "guard-until" }, "challenging unknown logins until ", when(guard.active_until)) : null,
    guard.released_until ? h("div", { id: "guard-released" }, "turned off by an analyst until ", when(guard.released_until)) : null,
    h("div", { class: "legend", id: "guard-threshold" },
      `${guard.unknown_failures} of ${guard.threshold} failures from unknown contexts in ${guard.window_s / 60} min (${basis})`),
    h("div", { class: "legend", id: "guard-logins" }, `${guard.failures} failed and ${guard.successes} successful logins in the window`),
    guard.blocked_networks.length ? h("div", { class: "legend" }, `${guard.blocked_networks.length} networks blocked`) : null,
    h("details", { class: "guard-release" }, h("summary", {}, "Turn off for a while…"),
      h("div", { class: "actions" }, reason, hours,
        h("button", { type: "button", class: "danger", id: "guard-release", onclick: release }, "Turn off"))));
}

// A subject key as a link to its view: an account, an address, a network (an IPv4 /24,
// an IPv6 /48 or /64) or an ASN's lockouts.
function subjectLink(key) {
  const [kind, ...rest] = key.split(":");
  const value = rest.join(":");
  if (kind === "user") return accountLink(decodeURIComponent(value));
  if (kind === "ip" || kind === "net") return h("a", { href: "#/ip/" + encodeURIComponent(value) }, key);
  if (kind === "asn") return h("a", { href: "#/lockouts" + query({ asn: "AS" + value, status: "all" }) }, key);
  return key;
}

function alertsTable(items) {
  return table("Alerts", ["When", "Kind", "Subject", "What"], items.map((a) => [
    when(a.created_at), h("span", { class: "kind" }, a.kind), subjectLink(a.subject), a.message]), "No alerts.");
}

const LOCKOUT_FILTERS = [
  ["account", "Account", "text"], ["ip", "IP or CIDR", "text"], ["asn", "ASN", "text"], ["device_id", "Device", "text"],
  ["reason", "Reason", "text"], ["since", "Created after (UTC)", "datetime-local"], ["until", "Created before (UTC)", "datetime-local"],
];

// Date-time fields are in UTC too, as every time shown.
function toRfc3339(field) { return field ? new Date(field + ":00Z").toISOString() : ""; }
function toField(rfc3339) { return rfc3339 ? new Date(rfc3339).toISOString().slice(0, 16) : ""; }

async function lockoutsView(params) {
  const filter = {};
  for (const [name] of LOCKOUT_FILTERS) if (params.get(name)) filter[name] = params.get(name);
  const status = params.get("status") || "active";
  const inputs = LOCKOUT_FILTERS.map(([name, label, type]) => h("label", {}, label,
    h("input", { name, type, value: type === "datetime-local" ? toField(filter[name]) : filter[name] || "" })));
  const statusSelect = h("select", { name: "status" }, ["active", "released", "expired", "all"].map((s) =>
    h("option", { value: s, selected: s === status }, s)));
  const form = h("form", { class: "filters", onsubmit: (e) => {
    e.preventDefault();
    const data = new FormData(form);
    const next = {};
    for (const [name, , type] of LOCKOUT_FILTERS) {
      const v = String(data.get(name) || "").trim();
      if (v) next[name] = type === "datetime-local" ? toRfc3339(v) : v;
    }
    next.status = data.get("status");
    location.hash = "#/lockouts" + query(next);
  } }, inputs, h("label", {}, "Status", statusSelect), h("button", { type: "submit" }, "Search"));

  let page;
  try {
    page = await api("GET", "/v1/lockouts" + query(Object.assign({ status, limit: 100, cursor: params.get("cursor") }, filter)));
  } catch (err) {
    if (err.status !== 400) throw err;
    // A search the API refuses: the form stays to correct it, no results are shown.
    show("Lockouts", form);
    return say(err.message, "error");
  }
  const boxes = [];
  const rows = page.items.map((l) => {
    const box = h("input", { type: "checkbox", value: l.id, "aria-label": "Select lockout of " + l.account,
      disabled: l.released_at || status !== "active" ? true : null });
    boxes.push(box);
    return [h("td", {}, box), accountLink(l.account), h("span", { class: "kind" }, l.reason), num(l.failures), num(l.level),
      when(l.created_at), when(l.locked_until),
      l.released_at ? h("span", {}, "released by ", l.released_by, ": ", l.release_reason) : h("span", { class: "badge bad" }, "locked"),
      h("a", { href: "#/lockout/" + l.id }, "Details")];
  });

  const reason = h("input", { id: "release-reason", name: "reason", placeholder: "Why (kept in the audit log)", size: 36 });
  const preview = h("div", { id: "release-preview" });
  const selected = () => boxes.filter((b) => b.checked).map((b) => b.value);
  const needReason = () => {
    if (!reason.value.trim()) { say("Give a reason for the release.", "error"); reason.focus(); return false; }
    return true;
  };
  const releaseSelected = async () => {
    const ids = selected();
    if (!ids.length) return say("Select lockouts first.", "error");
    if (!needReason()) return;
    let done = 0;
    for (const id of ids) {
      await api("POST", `/v1/lockouts/${id}/release`, { reason: reason.value.trim() });
      done += 1;
    }
    say(`Released ${done} lockout${done === 1 ? "" : "s"}.`);
    render();
  };
  const narrowed = Object.keys(filter).length > 0;
  const releaseMatching = async (dryRun) => {
    if (!needReason()) return;
    const answer = await api("POST", "/v1/lockouts/release", { filter, reason: reason.value.trim(), dry_run: dryRun });
    say("");
    if (dryRun) {
      preview.replaceChildren(h("p", {}, `${answer.count}${answer.truncated ? "+" : ""} lockout(s) would be released: `,
        answer.items.slice(0, 20).map((l) => l.account).join(", "), answer.count > 20 ? ", …" : ""),
      h("button", { type: "button", class: "danger", id: "release-confirm", onclick: guarded(() => releaseMatching(false)) },
        `Release ${answer.count}`));
    } else {
      say(`Released ${answer.count} lockout${answer.count === 1 ? "" : "s"}.`);
      render();
    }
  };

  show("Lockouts", form,
    table("Lockouts", ["", "Account", "Reason", "Failures", "Level", "Created", "Until", "Status", ""], rows,
      "No lockouts match."),
    page.next_cursor ? h("p", {}, h("a", { href: "#/lockouts" + query(Object.assign({}, filter, { status, cursor: page.next_cursor })) }, "Older →")) : "",
    status === "active" && page.items.length ? h("div", { class: "actions" },
      h("label", { for: "release-reason" }, "Reason "), reason,
      h("button", { type: "button", onclick: guarded(releaseSelected) }, "Release selected"),
      narrowed ? h("button", { type: "button", class: "secondary", id: "release-matching", onclick: guarded(() => releaseMatching(true)) },
        "Release all matching…") : "") : "",
    preview);
}

// Release one lockout, with the reason the audit log keeps.
function releaseForm(l) {
  const reason = h("input", { id: "release-one-reason", placeholder: "Why (kept in the audit log)", size: 30 });
  return h("form", { class: "actions", onsubmit: guarded(async (e) => {
    e.preventDefault();
    if (!reason.value.trim()) { say("Give a reason for the release.", "error"); reason.focus(); return; }
    await api("POST", `/v1/lockouts/${encodeURIComponent(l.id)}/release`, { reason: reason.value.trim() });
    say(`Released the lockout of ${l.account}.`);
    render();
  }) },
  h("label", { for: "release-one-reason", class: "visually-hidden" }, "Reason for the release"), reason,
  h("button", { type: "submit", class: "danger" }, "Release"));
}

function retimeForm(l) {
  const until = h("input", { id: "retime-until", type: "datetime-local", value: toField(l.locked_until), required: true });
  const reason = h("input", { id: "retime-reason", placeholder: "Why (kept in the audit log)", size: 30 });
  const form = h("form", { class: "actions", onsubmit: guarded(async (e) => {
    e.preventDefault();
    if (!reason.value.trim()) { say("Give a reason for the change.", "error"); reason.focus(); return; }
    await api("PATCH", "/v1/lockouts/" + encodeURIComponent(l.id), {
      locked_until: toRfc3339(until.value), reason: reason.value.trim() });
    say("The lockout now ends at " + utc(toRfc3339(until.value)) + ".");
    render();
  }) },
  h("label", { for: "retime-until" }, "Locked until (UTC) "), until,
  h("label", { for: "retime-reason", class: "visually-hidden" }, "Reason for the change"), reason,
  h("button", { type: "submit", class: "secondary" }, "Extend or shorten"));
  return form;
}

// The first `failures` events (oldest first) reached the threshold and caused the lock, as
// the header counts them; the failures after those are listed apart.
async function lockoutView(id) {
  const l = await api("GET", "/v1/lockouts/" + encodeURIComponent(id));
  const active = !l.released_at && new Date(l.locked_until) > new Date();
  const before = l.events.slice(0, l.failures);
  const after = l.events.slice(l.failures);
  const rows = (events) => events.map((e) => [when(e.ts), e.type, ipLink(e.ip), e.device_id || "", e.endpoint || ""]);
  const columns = ["When", "Type", "IP", "Device", "Endpoint"];
  const missing = l.failures - before.length;
  show("Lockout of " + l.account,
    h("p", {}, accountLink(l.account), ` · ${l.reason} · ${l.failures} failures · level ${l.level} · until `, when(l.locked_until)),
    l.released_at ? h("p", {}, "Released ", when(l.released_at), ` by ${l.released_by}: ${l.release_reason}`) : "",
    active ? releaseForm(l) : "",
    active ? retimeForm(l) : "",
    h("h2", { id: "caused" }, `The ${before.length} failures that caused it`),
    missing > 0 ? h("p", { class: "muted" }, `${missing} more are past the event retention.`) : "",
    table("Failures that caused it", columns, rows(before), "None retained."),
    after.length ? h("h2", { id: "while-locked" }, `${after.length} more after it locked`) : "",
    after.length ? table("Failures after the lock", columns, rows(after)) : "");
}

async function failingView() {
  const page = await api("GET", "/v1/accounts/failing?locked=false&limit=200");
  show("Failing, not locked",
    h("p", { class: "muted" }, "Accounts with failed logins in the last 24 hours and no lockout in force, most failures first."),
    table("Failing accounts", ["Account", "Failures", "IPs", "Devices", "First", "Last"], page.items.map((f) => [
      accountLink(f.account), num(f.failures), num(f.ips), num(f.devices), when(f.first_at), when(f.last_at)]),
    "No account is failing."));
}

function clearButton(body, label) {
  const reason = h("input", { placeholder: "Why (kept in the audit log)", "aria-label": "Reason for clearing penalties", size: 30 });
  return h("div", { class: "actions" }, reason, h("button", { type: "button", class: "secondary", onclick: guarded(async () => {
    if (!reason.value.trim()) return say("Give a reason.", "error");
    const answer = await api("POST", "/v1/penalties/clear", Object.assign({ reason: reason.value.trim() }, body));
    say(`Cleared ${answer.cleared.length} factor(s) of ${answer.subject}.`);
    render();
  }) }, label));
}

function multiplierTable(view) {
  const rows = [];
  for (const [key, k] of Object.entries(view.keys)) {
    const reasons = k.reasons.map((r) => `${r.code}${r.shadow ? " (shadow)" : ""}: ${r.message}`).join("; ");
    rows.push([key, num(k.multiplier), reasons || "—"]);
  }
  return table("Multipliers", ["Key", "Multiplier", "Why"], rows);
}

async function accountView(account) {
  const [timeline, lockouts, multipliers, history] = await Promise.all([
    api("GET", `/v1/accounts/${encodeURIComponent(account)}/timeline?limit=200`),
    api("GET", "/v1/lockouts" + query({ account, status: "all", limit: 20 })),
    api("GET", "/v1/multipliers" + query({ user_id: account, endpoint: "/auth/login", method: "POST" })),
    api("GET", "/v1/history" + query({ account, limit: 20 })),
  ]);
  const active = lockouts.items.filter((l) => !l.released_at && new Date(l.locked_until) > new Date());
  show("Account " + timeline.account,
    active.length ? h("p", {}, h("span", { class: "badge bad" }, "locked"), " until ", when(active[0].locked_until), " · ",
      h("a", { href: "#/lockout/" + encodeURIComponent(active[0].id) }, `${active[0].reason}, ${active[0].failures} failures`)) :
      h("p", {}, h("span", { class: "badge ok" }, "not locked")),
    active.length ? releaseForm(active[0]) : "",
    active.length ? retimeForm(active[0]) : "",
    h("h2", {}, "Multipliers on auth"), multiplierTable(multipliers),
    clearButton({ account: timeline.account }, "Clear penalties"),
    h("p", {}, h("button", { type: "button", class: "secondary", id: "export", onclick: guarded(async () => {
      const data = await api("GET", `/v1/accounts/${encodeURIComponent(timeline.account)}/export`);
      const link = h("a", { href: URL.createObjectURL(new Blob([JSON.stringify(data, null, 2)], { type: "application/json" })),
        download: "palisade-export.json" }, "Download the export (JSON)");
      say("");
      document.getElementById("export").replaceWith(link);
      link.focus();
    }) }, "Export everything stored (data-subject request)")),
    h("h2", {}, "Refusals and challenges (decision history)"),
    historyTable(history.items),
    h("h2", {}, "Timeline"),
    table("Timeline", ["When", "What", "Details"], timeline.items.map((i) => [
      when(i.at), h("span", { class: "kind" }, i.kind), i.summary])),
    timeline.next_until ? h("p", { class: "muted" }, "Older items: narrow with the API's until parameter.") : "");
}

// An address, or a network (CIDR): the accounts it failed on and the lockouts it caused; an
// address also its reputation, multipliers and refusals (the decision history is kept per
// address).
async function ipView(ip) {
  const network = ip.includes("/");
  const [reputation, multipliers, failing, lockouts, history] = await Promise.all([
    network ? null : api("GET", "/v1/reputation/" + encodeURIComponent(ip)),
    network ? null : api("GET", "/v1/multipliers" + query({ ip, endpoint: "/auth/login", method: "POST" })),
    api("GET", "/v1/accounts/failing" + query({ ip, limit: 100 })),
    api("GET", "/v1/lockouts" + query({ ip, status: "all", limit: 100 })),
    network ? null : api("GET", "/v1/history" + query({ ip, limit: 50 })),
  ]);
  const about = network ? [h("p", { class: "muted" }, "Every address in this network.")] : [
    h("p", {}, reputation.asn ? h("a", { href: "#/lockouts" + query({ asn: "AS" + reputation.asn, status: "all" }) },
      `AS${reputation.asn}`) : "ASN unknown", reputation.as_org ? ` (${reputation.as_org})` : "", " · classes: ",
      reputation.classes.length ? reputation.classes.join(", ") : "none", ` · reputation multiplier ${reputation.multiplier}`),
    h("h2", {}, "Multipliers on auth"), multiplierTable(multipliers),
    clearButton({ ip }, "Clear penalties of this IP")];
  show(network ? "Network " + ip : "IP " + reputation.ip, ...about,
    h("h2", {}, "Accounts it failed on (24 h)"),
    table("Accounts", ["Account", "Failures", "Last", "Locked"], failing.items.map((f) => [
      accountLink(f.account), num(f.failures), when(f.last_at), f.lockout_id ? h("span", { class: "badge bad" }, "locked") : ""]),
    network ? "No failures from this network." : "No failures from this address."),
    ...(network ? [] : [h("h2", {}, "Refusals and challenges (decision history)"), historyTable(history.items)]),
    h("h2", {}, "Lockouts it caused"),
    table("Lockouts", ["Account", "Reason", "Created", "Status"], lockouts.items.map((l) => [
      accountLink(l.account), l.reason, when(l.created_at), l.released_at ? "released" : "locked"]), "None."));
}

// Why each refusal happened: the deciding bucket and the reasons of the keys' multipliers.
function why(entry) {
  const e = entry.explanation || {};
  const scope = (e.scopes || [])[e.deciding];
  const parts = [];
  if (scope) parts.push(`${scope.budget} (${scope.scope} ${scope.key}): ${scope.remaining}/${scope.limit} left, ×${scope.multiplier}`);
  for (const [key, k] of Object.entries(e.keys || {})) {
    const enforced = k.reasons.filter((r) => !r.shadow).map((r) => r.code);
    if (enforced.length) parts.push(`${key} ×${k.multiplier}: ${enforced.join(", ")}`);
  }
  return parts.join(" · ");
}

function historyTable(items) {
  return table("Decision history", ["From", "To", "Count", "Class", "Outcome", "Why"], items.map((d) => [
    when(d.first_at), when(d.last_at), num(d.count), d.class,
    h("span", { class: "badge " + (d.outcome === "limited" ? "bad" : "warn") }, `${d.outcome}: ${d.reason}`),
    why(d)]), "Nothing refused.");
}

async function policyView() {
  const overrides = await api("GET", "/v1/overrides");
  let canary = null;
  try {
    canary = await api("GET", "/v1/policy/candidates/current");
  } catch (err) {
    if (err.status !== 404) throw err;
  }
  show("Policy",
    h("h2", {}, "Overrides in force"),
    table("Overrides", ["Subject", "Classes", "Multiplier", "Until", "Who and why"], overrides.items.map((o) => [
      subjectLink(o.subject), o.classes.length ? o.classes.join(", ") : "all", num(o.multiplier), when(o.expires_at), o.message]),
    "No overrides. An admin sets them with POST /v1/overrides or palisade overrides set."),
    h("h2", {}, "Canary"),
    ...(canary ? [
      h("p", {}, `Candidate ${canary.id} loaded by ${canary.created_by}: ${canary.reason}. Counts of this instance since it loaded it.`),
      table("Canary", ["Class", "Checks", "Same", "Would refuse", "Would allow"], Object.entries(canary.classes).map(([c, n]) => [
        c, num(n.checks), num(n.same), num(n.would_refuse), num(n.would_allow)]), "No checks yet."),
    ] : [h("p", { class: "muted" }, "No canary policy is running. An admin loads one with POST /v1/policy/candidates.")]));
}

// Alerts; a messaging destination tightened for its collapsed OTP conversion can be lifted
// here, with a reason (a carrier's outage, not SMS pumping).
async function alertsView() {
  const page = await api("GET", "/v1/alerts?limit=200");
  const tightened = [...new Set(page.items.filter((a) => a.kind === "otp_conversion").map((a) => a.subject))];
  show("Alerts", alertsTable(page.items),
    ...(tightened.length ? [h("h2", {}, "Messaging destinations tightened"), ...tightened.map(liftForm)] : []));
}

function liftForm(subject) {
  const destination = subject.replace(/^destination:/, "");
  const reason = h("input", { placeholder: "Why (kept in the audit log)", "aria-label": "Reason for lifting " + destination, size: 30 });
  return h("div", { class: "actions" }, h("span", { class: "kind" }, subject), reason,
    h("button", { type: "button", class: "secondary", onclick: guarded(async () => {
      if (!reason.value.trim()) { say("Give a reason for lifting it.", "error"); reason.focus(); return; }
      const answer = await api("POST", "/v1/penalties/clear", { destination, reason: reason.value.trim() });
      say(`Lifted ${answer.cleared.join(", ") || "nothing"} on ${answer.subject}.`);
    }) }, "Lift the tightening"));
}

async function auditView(params) {
  const page = await api("GET", "/v1/audit" + query({ limit: 100, cursor: params.get("cursor") }));
  show("Audit log",
    table("Audit log", ["When", "Who", "Action", "Target", "Details"], page.items.map((e) => [
      when(e.at), `${e.actor.name} (${e.actor.role})`, h("span", { class: "kind" }, e.action), e.target,
      h("pre", {}, JSON.stringify(e.details))])),
    page.next_cursor ? h("p", {}, h("a", { href: "#/audit" + query({ cursor: page.next_cursor }) }, "Older →")) : "");
}

// ---- Routing -----------------------------------------------------------------------

const TITLES = { "": "Overview", lockouts: "Lockouts", lockout: "Lockout", failing: "Failing, not locked",
  account: "Account", ip: "IP", alerts: "Alerts", policy: "Policy", budgets: "Budgets", audit: "Audit log" };

async function render() {
  if (!sessionStorage.getItem(TOKEN_KEY)) return signInView();
  for (const id of ["nav", "lookup", "signout"]) document.getElementById(id).hidden = false;
  const [path, search] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(search || "");
  const parts = path.split("/").filter(Boolean);
  for (const link of document.querySelectorAll("#nav a")) {
    const target = link.getAttribute("href").slice(1);
    link.toggleAttribute("aria-current", target === "/" + (parts[0] || ""));
    if (link.hasAttribute("aria-current")) link.setAttribute("aria-current", "page");
  }
  // The old view goes at once: a failure never leaves the previous page's data on screen.
  view().dataset.title = TITLES[parts[0] || ""] || "Palisade console";
  view().replaceChildren(h("h1", {}, view().dataset.title), h("p", { class: "muted", id: "loading" }, "Loading…"));
  try {
    const arg = parts[1] ? decodeURIComponent(parts.slice(1).join("/")) : "";
    switch (parts[0]) {
      case undefined: await overviewView(params); break;
      case "lockouts": await lockoutsView(params); break;
      case "lockout": await lockoutView(arg); break;
      case "failing": await failingView(); break;
      case "account": await accountView(arg); break;
      case "ip": await ipView(arg); break;
      case "alerts": await alertsView(); break;
      case "policy": await policyView(); break;
      case "budgets": await budgetsView(); break;
      case "audit": await auditView(params); break;
      default: show("Not found", h("p", {}, "No such view."));
    }
  } catch (err) {
    show(view().dataset.title || "Palisade console");
    failed(err);
  }
}

// An address or a network (CIDR) opens the address view, anything else the account.
function looksLikeIp(text) {
  const [address, bits, extra] = text.split("/");
  if (extra !== undefined || (bits !== undefined && !/^[0-9]{1,3}$/.test(bits))) return false;
  return /^[0-9]{1,3}(\.[0-9]{1,3}){3}$/.test(address) || (address.includes(":") && /^[0-9a-fA-F:.]+$/.test(address));
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("lookup").addEventListener("submit", (e) => {
    e.preventDefault();
    const q = document.getElementById("lookup-q").value.trim();
    if (q) location.hash = (looksLikeIp(q) ? "#/ip/" : "#/account/") + encodeURIComponent(q);
  });
  document.getElementById("signout").addEventListener("click", () => signOut());
  window.addEventListener("hashchange", () => { say(""); render().then(() => view().focus()); });
  render();
});
