// prewarm dashboard: reads the gateway's admin API with the read token (and the decision counters of its
// /metrics) every few seconds and renders pods, the adapters x pods residency heatmap, the hot
// prefixes with their placement, the decisions so far and recent warm-up and adapter events. No dependencies; every text from the API goes through
// textContent. `?refresh=MS` sets the period (default 2000, at least 500); `?k=N` the number
// of prefixes shown (default 15).
"use strict";

const params = new URLSearchParams(location.search);
const REFRESH_MS = Math.max(500, Number(params.get("refresh")) || 2000);
const TOP_K = Math.min(200, Math.max(1, Number(params.get("k")) || 15));
// Prompts read to weigh adapters by hotness (their `model` is the adapter's name).
const HOTNESS_K = 1000;
const MAX_EVENTS = 25;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null) continue;
    if (k === "class") node.className = v;
    else if (k === "style") node.setAttribute("style", v);
    else if (k.startsWith("data-")) node.setAttribute(k, String(v));
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

// The read token: typed into the sign-in form, kept in this tab's sessionStorage (never in a
// URL), sent as `Authorization: Bearer`. A 401 clears it and shows the form again.
const TOKEN_KEY = "prewarm-read-token";

class Unauthorized extends Error {}

function showSignin(message) {
  const form = document.getElementById("signin");
  form.hidden = false;
  const summary = document.getElementById("summary");
  summary.textContent = message;
  summary.className = "error";
}

document.getElementById("signin").addEventListener("submit", (event) => {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  document.getElementById("signin").hidden = true;
  document.getElementById("summary").textContent = "loading…";
});

async function getJson(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) throw new Unauthorized("sign in with the gateway's read token");
  const r = await fetch(path, { cache: "no-store", headers: { Authorization: `Bearer ${token}` } });
  if (r.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new Unauthorized("the read token was refused: sign in again");
  }
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

// The policies' decision counters (`prewarm_policy_decisions_total{policy,decision}`) from the
// gateway's /metrics: the API keeps no decision log, the counters say what was decided so far.
async function decisionCounts() {
  const r = await fetch("/metrics", { cache: "no-store" });
  if (!r.ok) throw new Error(`/metrics: HTTP ${r.status}`);
  const out = [];
  for (const line of (await r.text()).split("\n")) {
    const m = /^prewarm_policy_decisions_total\{([^}]*)\}\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...m[1].matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    out.push({ policy: labels.policy, decision: labels.decision, count: Number(m[2]) });
  }
  return out.sort((a, b) => `${a.policy} ${a.decision}`.localeCompare(`${b.policy} ${b.decision}`));
}

// Everything the page shows, from the API; `pods` carry their detail and plan.
async function load() {
  const [list, heatmap, prompts, adapters, decisions, experiments] = await Promise.all([
    getJson("/admin/pods"),
    getJson("/admin/adapters/heatmap"),
    getJson(`/admin/prompts?k=${HOTNESS_K}`),
    getJson("/admin/adapters"),
    decisionCounts(),
    getJson("/admin/experiments"),
  ]);
  const running = experiments.running;
  const experiment = running
    ? await getJson(`/admin/experiments/${encodeURIComponent(running.definition.id)}`).catch(() => null)
    : null;
  const pods = await Promise.all(list.pods.map(async (p) => {
    const id = encodeURIComponent(p.id);
    const [detail, plan] = await Promise.all([
      getJson(`/admin/pods/${id}`).catch(() => null),
      getJson(`/admin/pods/${id}/plan`).catch(() => null),
    ]);
    return { ...p, detail, plan };
  }));
  return { pods, heatmap, prompts, adapters: adapters.adapters, decisions, experiment };
}

// warming / warm / down / idle (no warm-up yet).
function podState(p) {
  if (p.health === "down") return "down";
  if (p.warmup_phase === "done") return "warm";
  if (["adapters", "first_tier", "second_tier"].includes(p.warmup_phase)) return "warming";
  return "idle";
}

function tierText(t) {
  return t ? `${t.done + t.failed + t.skipped}/${t.total}` : "–";
}

function progressOf(w) {
  if (!w) return null;
  const tiers = [w.adapters, w.first_tier, w.second_tier];
  const total = tiers.reduce((s, t) => s + t.total, 0);
  const done = tiers.reduce((s, t) => s + t.done + t.failed + t.skipped, 0);
  return total === 0 ? 1 : done / total;
}

function renderPods(view) {
  const rows = view.pods.map((p) => {
    const state = podState(p);
    const w = p.detail && p.detail.warmup;
    const progress = progressOf(w);
    const hit = p.detail && p.detail.modelled_hit_ratio;
    const engine = p.detail && p.detail.kv_events;
    return el("tr", { "data-pod": p.id, "data-state": state, "data-routable": p.routable,
                      "data-phase": p.warmup_phase || "" },
      el("td", {}, el("b", {}, p.id), " ", el("span", { class: "muted mono" }, p.address)),
      el("td", { class: `health-${p.health}` }, p.health),
      el("td", {}, el("span", { class: `badge state-${state}` }, state)),
      el("td", {}, p.routable ? "✓ yes" : "no"),
      el("td", { "data-progress": progress === null ? "" : progress.toFixed(3) },
        progress === null ? "not planned" : [
          el("span", { class: "progress" },
            el("span", { style: `width:${Math.round(progress * 100)}%` })),
          `${p.warmup_phase} · adapters ${tierText(w.adapters)} · first ${tierText(w.first_tier)}`
            + ` · second ${tierText(w.second_tier)}` + (w.lazy ? ` · lazy ${w.lazy}` : "")
            + (w.attempt > 1 ? ` · attempt ${w.attempt}` : ""),
        ]),
      el("td", {}, `${p.waiting} waiting / ${p.running} running`),
      el("td", { "data-engine-blocks": engine ? engine.cached_blocks : "" },
        `${Math.round(p.kv_usage * 100)}%`,
        engine ? el("span", { class: "muted" }, ` · ${engine.cached_blocks} blocks cached`
          + (engine.complete ? "" : " (incomplete)")) : ""),
      el("td", {}, hit === null || hit === undefined ? "–" : `${Math.round(hit * 100)}%`),
      el("td", { class: "mono" }, p.adapters.join(", ") || "–"));
  });
  document.querySelector("#pods tbody").replaceChildren(...rows);
}

// Sum of the hotness of the prompts whose model is the adapter.
function adapterHotness(prompts) {
  const hot = new Map();
  for (const p of prompts) hot.set(p.model, (hot.get(p.model) || 0) + p.hotness);
  return hot;
}

// The heatmap cell refined with the pod's detail: a cell the LoRA model holds but the pod has
// not confirmed yet (no loaded version, not in /v1/models) is `loading`; an adapter the model
// remembers on the pod but no longer registers there is `evicted`.
function cellState(cell, adapter, detail) {
  const confirmed = !!detail && (adapter in (detail.versions || {})
    || ((detail.served && detail.served.adapters) || []).some((a) => a[0] === adapter));
  if (cell === "gpu") return confirmed ? "resident" : "loading";
  if (cell === "registered") return confirmed ? "host" : "loading";
  const known = !!detail && (detail.lora || []).some((a) => a.name === adapter);
  return known ? "evicted" : "absent";
}

const GLYPH = { resident: "●", loading: "◐", host: "○", evicted: "×", absent: "" };

function renderHeatmap(view) {
  const { adapters, pods, cells } = view.heatmap;
  const records = new Map(view.adapters.map((a) => [a.name, a]));
  const details = new Map(view.pods.map((p) => [p.id, p.detail]));
  const hot = adapterHotness(view.prompts.prompts);
  const max = Math.max(0, ...adapters.map((a) => hot.get(a) || 0));
  const head = el("tr", {}, el("th", {}, "adapter"), el("th", {}, "hotness"),
    pods.map((p) => el("th", { class: "mono" }, p)));
  const rows = adapters.map((a, i) => {
    const rec = records.get(a) || {};
    const h = hot.get(a) || 0;
    const alpha = max > 0 ? 0.35 + 0.65 * (h / max) : 0.6;
    return el("tr", { "data-adapter": a, "data-hotness": h, "data-alpha": alpha.toFixed(2) },
      el("td", {}, el("b", { class: "mono" }, a),
        el("span", { class: "muted" }, ` ${rec.tier || ""}${rec.pinned ? " · pinned" : ""}`
          + (rec.tenant ? ` · ${rec.tenant}` : ""))),
      el("td", {}, h.toFixed(2)),
      pods.map((pod, j) => {
        const cell = (cells[i] || [])[j] || "absent";
        const state = cellState(cell, a, details.get(pod));
        return el("td", { class: `cell ${state}`, style: `--hot:${alpha.toFixed(2)}`,
                          title: `${a} on ${pod}: ${state} (hotness ${h.toFixed(2)})`,
                          "data-adapter": a, "data-pod": pod, "data-cell": cell,
                          "data-state": state }, GLYPH[state]);
      }));
  });
  document.querySelector("#heatmap thead").replaceChildren(head);
  document.querySelector("#heatmap tbody").replaceChildren(...rows);
  document.getElementById("heatmap-empty").hidden = adapters.length > 0;
}

// Where each prefix is placed: the pods whose plans list it (several when a joining pod's plan
// took a prefix held on two pods), each marked `(warming)` while not in the routing table yet.
function placements(pods) {
  const placed = new Map();
  for (const p of pods) {
    if (!p.plan) continue;
    for (const key of [...p.plan.first_tier, ...p.plan.second_tier]) {
      if (!placed.has(key)) placed.set(key, []);
      placed.get(key).push(p.routable ? p.id : `${p.id}(warming)`);
    }
  }
  return placed;
}

function renderPrefixes(view) {
  const placed = placements(view.pods);
  const top = view.prompts.prompts.slice(0, TOP_K);
  const max = Math.max(0, ...top.map((p) => p.hotness));
  const rows = top.map((p) => {
    const on = (placed.get(p.key) || []).sort();
    return el("tr", { "data-key": p.key, "data-hotness": p.hotness, "data-placed": on.join(",") },
      el("td", { class: "mono", title: p.key }, p.key.slice(-8)),
      el("td", {}, el("span", { class: "bar",
                                style: `width:${max > 0 ? Math.round(60 * p.hotness / max) : 0}px` }),
        p.hotness.toFixed(2)),
      el("td", {}, p.tenant || "–"),
      el("td", { class: "mono" }, p.model),
      el("td", {}, p.origin),
      el("td", { class: "mono" }, on.join(", ") || "–"),
      el("td", { class: "preview", title: p.preview }, p.preview));
  });
  document.querySelector("#prefixes tbody").replaceChildren(...rows);
}

// Events the API exposes, newest first: warm-up starts and first tiers done, adapters loaded
// (their version) and put in a GPU slot, and each pod's recent errors.
function events(pods) {
  const out = [];
  for (const p of pods) {
    const d = p.detail;
    if (!d) continue;
    const w = d.warmup;
    if (w) {
      out.push({ ms: w.started_ms, text: `${p.id}: warm-up started (attempt ${w.attempt})` });
      if (w.first_tier_done_ms) out.push({ ms: w.first_tier_done_ms,
        text: `${p.id}: first tier warm (${(w.first_tier_done_ms - w.started_ms) / 1000}s)` });
    }
    for (const [name, v] of Object.entries(d.versions || {})) {
      out.push({ ms: v.loaded_at_ms, text: `${p.id}: loaded adapter ${name} ${v.version}` });
    }
    for (const a of d.lora || []) {
      if (a.gpu_since_ms) out.push({ ms: a.gpu_since_ms, text: `${p.id}: ${a.name} in a GPU slot`
        + (a.pinned ? " (pinned)" : "") });
    }
    for (const e of d.errors || []) {
      const space = e.indexOf(" ");
      out.push({ ms: Number(e.slice(0, space)) || 0, text: e.slice(space + 1), error: true });
    }
  }
  return out.sort((a, b) => b.ms - a.ms).slice(0, MAX_EVENTS);
}

function renderEvents(view) {
  const items = events(view.pods).map((e) => el("li", { class: e.error ? "event-error" : "", title: e.text },
    el("span", { class: "muted mono" }, new Date(e.ms).toISOString().slice(11, 19), " "), e.text));
  if (items.length === 0) items.push(el("li", { class: "muted" }, "nothing yet"));
  document.getElementById("events").replaceChildren(...items);
  const counts = view.decisions.map((d) => el("span", { class: "decision", "data-policy": d.policy,
    "data-decision": d.decision, "data-count": d.count }, `${d.policy} ${d.decision} `, el("b", {}, d.count)));
  document.getElementById("decisions").replaceChildren(...(counts.length ? counts : ["none yet"]));
}

const ms = (v) => (v === null || v === undefined ? "–" : `${Math.round(v)} ms`);
const pct = (v) => (v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)} %`);

// The running experiment: each arm's outcomes, its comparison with the first arm, the release.
function renderExperiment(view) {
  const e = view.experiment;
  const title = document.getElementById("experiment-title");
  const table = document.getElementById("experiment");
  const release = document.getElementById("experiment-release");
  table.hidden = !e;
  if (!e) {
    title.textContent = "none running";
    table.querySelector("tbody").replaceChildren();
    release.textContent = "";
    return;
  }
  const r = e.report;
  title.textContent = `${e.definition.id} · since ${new Date(e.started_ms).toISOString().slice(0, 19)} UTC`;
  const rows = e.definition.arms.map((arm, i) => {
    const s = r.arms[i] || {};
    const c = r.comparisons.find((x) => x.arm === arm.name);
    const n = r.new_pods.arms[i] || {};
    const f = (r.new_pods.first_requests && r.new_pods.first_requests.arms[i]) || {};
    const verdict = (v) => !v ? "–"
      : `${v.worse ? "slower" : v.better ? "faster" : "no difference"}`
        + ` (p ${v.welch ? v.welch.p.toExponential(1) : "–"}`
        + ` / ${v.mann_whitney ? v.mann_whitney.p.toExponential(1) : "–"})`;
    return el("tr", { "data-arm": arm.name, "data-weight": arm.weight, "data-requests": s.requests ?? 0 },
      el("td", {}, arm.name), el("td", {}, pct(arm.weight)),
      el("td", {}, `${arm.settings.warmup ? "warm-up" : "no warm-up"} · `
        + `${arm.settings.routing === "off" ? "Envoy's balancing" : "prefix routing"}`),
      el("td", {}, String(s.requests ?? 0)), el("td", {}, pct(s.error_rate)),
      el("td", {}, ms(s.ttfb_p50_ms)), el("td", {}, ms(s.ttfb_p95_ms)), el("td", {}, pct(s.cached_token_ratio)),
      el("td", { class: c && c.worse ? "event-error" : "" }, c ? verdict(c) : "reference"),
      el("td", { class: c && c.prompt_adjusted && c.prompt_adjusted.worse ? "event-error" : "" },
        c ? verdict(c.prompt_adjusted) : "reference"),
      el("td", {}, `${ms(n.ttfb_p50_ms)} / ${ms(n.ttfb_p95_ms)}`),
      el("td", {}, `${f.requests ?? 0} · ${ms(f.ttfb_p50_ms)} / ${ms(f.ttfb_p95_ms)}`));
  });
  table.querySelector("tbody").replaceChildren(...rows);
  const state = e.release;
  const last = e.events.length ? e.events[e.events.length - 1].event : "";
  release.textContent = !state ? `last event: ${last}`
    : state.rolled_back ? `release rolled back (${state.rolled_back.reason}): ${state.rolled_back.detail}`
      : `release step ${state.step + 1} of ${e.definition.release.steps.length} · last event: ${last}`;
}

let refreshes = 0;

async function refresh() {
  const summary = document.getElementById("summary");
  try {
    const view = await load();
    renderPods(view);
    renderHeatmap(view);
    renderPrefixes(view);
    renderEvents(view);
    renderExperiment(view);
    const routed = view.pods.filter((p) => p.routable).length;
    summary.textContent = `${view.pods.length} pods · ${routed} in the routing table · `
      + `${view.heatmap.adapters.length} adapters · ${view.prompts.total} prefixes`;
    summary.className = "muted";
    refreshes += 1;
    const stamp = document.getElementById("refreshed");
    stamp.textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
    stamp.setAttribute("data-refreshes", String(refreshes));
  } catch (e) {
    if (e instanceof Unauthorized) {
      showSignin(e.message);
    } else {
      summary.textContent = `cannot read the admin API: ${e.message}`;
      summary.className = "error";
    }
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
