// The console's Budgets view (admin): budgets suggested from the traffic record, each
// budget's honest per-key histogram with the live and the suggested value drawn on it, the
// suggestion's replay against the live policy, and one click to run it as a canary. Loaded
// before app.js, whose helpers (h, svg, table, num, api, show, say, guarded) it calls.
"use strict";

// Honest key-windows by tokens spent per period, power-of-two buckets on a log scale (a
// bar's height is log10 of its count + 1), the live and the suggested value as lines.
function budgetHistogram(b) {
  const W = 320, H = 120, left = 4, bottom = 18;
  const buckets = b.histogram;
  const top = Math.max(b.live, b.suggested, ...buckets.map(([upTo]) => upTo), 2);
  const span = Math.log2(top) + 1;
  const x = (value) => left + (W - 2 * left) * Math.log2(Math.max(value, 1)) / span;
  const most = Math.max(...buckets.map(([, count]) => count), 1);
  const height = (count) => (H - bottom - 6) * Math.log10(count + 1) / Math.log10(most + 1);
  const bars = buckets.map(([upTo, count]) => {
    const from = x(Math.max(upTo / 2, 1)), to = x(upTo);
    const hgt = height(count);
    return svg("g", { class: "point" },
      svg("rect", { class: "allowed", x: from, y: H - bottom - hgt, width: Math.max(to - from - 1, 2), height: hgt }),
      svg("title", {}, `${count} key-windows spent up to ${upTo} tokens`));
  });
  // The live value's label to the right of its line, the suggested one's to the left, so
  // two values close together stay readable.
  const marker = (value, cls, label, dy, right) => svg("g", { class: cls },
    svg("line", { class: cls, x1: x(value), x2: x(value), y1: 4, y2: H - bottom }),
    svg("text", right
      ? { class: "tick", x: Math.min(x(value) + 3, W - 60), y: 12 + dy }
      : { class: "tick", x: Math.max(x(value) - 3, 70), y: 12 + dy, "text-anchor": "end" }, `${label} ${value}`));
  return svg("svg", { class: "chart histogram", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `${b.budget}: honest keys' tokens per period, live ${b.live}, suggested ${b.suggested}` },
    svg("line", { class: "axis", x1: left, x2: W - left, y1: H - bottom, y2: H - bottom }),
    ...bars,
    svg("text", { class: "tick", x: left, y: H - 4 }, "1"),
    svg("text", { class: "tick", x: W - left - 40, y: H - 4 }, `${top} (log)`),
    marker(b.live, "live", "live", 0, true), marker(b.suggested, "suggested", "suggested", 12, false));
}

function replayTable(caption, report) {
  return table(caption, ["Class", "Honest checks", "Refused live", "Refused suggested", "Flagged checks", "Refused live", "Refused suggested"],
    Object.entries(report.classes).map(([c, n]) => [c, num(n.requests - n.flagged),
      num(n.refused_live - n.flagged_refused_live), num(n.refused_candidate - n.flagged_refused_candidate),
      num(n.flagged), num(n.flagged_refused_live), num(n.flagged_refused_candidate)]), "No checks replayed.");
}

async function budgetsView() {
  let proposal;
  try {
    proposal = await api("GET", "/v1/policy/suggestions");
  } catch (err) {
    if (err.status !== 403) throw err;
    return show("Budgets", h("p", { class: "muted" }, "Suggesting budgets needs an admin token: sign in with one."));
  }
  if (proposal.empty) return show("Budgets", h("p", { class: "muted" }, "No checks to suggest from: " + proposal.empty));
  const s = proposal.suggestion;
  const counted = s.budgets.filter((b) => b.histogram.length);
  const reason = h("input", { id: "canary-reason", placeholder: "Why (kept in the audit log)", "aria-label": "Reason for the canary", size: 32 });
  const holdout = proposal.holdout;
  show("Budgets",
    h("p", {}, `Suggested from ${s.records} recorded checks: ${s.options.honest} % of honest keys under every budget, × ${s.options.headroom} headroom. Tokens are counted at multiplier 1.`),
    h("div", { class: "cards wide" }, counted.map((b) => h("div", { class: "card budget", "data-budget": b.budget },
      h("h2", {}, b.budget), h("p", { class: "legend" }, `${b.scope}, per ${b.period_s} s: live ${b.live}, suggested ${b.suggested}`),
      budgetHistogram(b), h("p", { class: "legend" }, b.note)))),
    h("h2", {}, "Every budget"),
    table("Budgets", ["Budget", "Scope", "Per", "Honest keys", "p50", "p99", "p99.9", "Max", "Live", "Suggested", "Honest over live", "Over suggested", "Flagged over live", "Over suggested"],
      s.budgets.map((b) => [b.budget, b.scope, `${b.period_s} s`, num(b.honest_keys), num(b.p50 ?? "–"), num(b.p99 ?? "–"),
        num(b.p999 ?? "–"), num(b.max ?? "–"), num(b.live), num(b.suggested), num(b.honest_over_live),
        num(b.honest_over_suggested), num(b.flagged_over_live), num(b.flagged_over_suggested)])),
    h("h2", {}, "Replayed against the live policy"),
    replayTable("Replay", proposal.replay),
    holdout ? h("p", { id: "holdout" }, `Hold-out: computed from the checks before ${utc(holdout.split_ms)}, replayed over the ${holdout.replay.requests} after: honest checks refused ${holdout.honest_refused_pct.toFixed(3)} % (target ≤ ${holdout.target_pct.toFixed(3)} %: ${holdout.honest_refused_pct <= holdout.target_pct ? "met" : "not met"}).`)
      : h("p", { class: "muted", id: "holdout" }, "No hold-out: the record spans fewer than ten of the longest budget period."),
    h("h2", {}, "Try it"),
    h("div", { class: "actions" }, reason,
      h("button", { type: "button", onclick: guarded(async () => {
        if (!reason.value.trim()) { say("Give a reason for the canary.", "error"); reason.focus(); return; }
        const loaded = await api("POST", "/v1/policy/candidates", { policy: s.toml, reason: reason.value.trim() });
        say(`Canary ${loaded.id} loaded: every instance runs it beside the live policy within a second (see Policy).`);
      }) }, "Run as a canary")));
}
