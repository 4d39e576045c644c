"""The viewer page's stylesheet and script, inlined into every page (served or exported) so one file is the app.

The script reads its data from the page's ``<script type="application/json" id="viewer-data">`` block and the
episodes the server rendered (already escaped); it builds everything else with ``textContent`` and
``createElement``, never from strings parsed as HTML, so model and env text cannot inject markup.
"""

from __future__ import annotations

__all__ = ["CSS", "SCRIPT"]

CSS = """
:root{--ok:#176f2c;--fail:#a31515;--line:#d8dbe0;--muted:#5f6670;--bg:#f6f7f9;--agent:#eef4ff;--env:#f4f4f4}
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:0;padding:12px 20px;color:#1d2127;font-size:14px}
h1{font-size:20px;margin:4px 0 12px;overflow-wrap:break-word;word-break:normal}
h2{font-size:15px;margin:0 0 6px}
#overview{display:flex;flex-direction:column;gap:12px;margin-bottom:12px}
#overview>section,#overview>details{border:1px solid var(--line);border-radius:6px;padding:8px 12px;background:#fff}
#overview summary{font-weight:600;cursor:pointer}
#settings>table.kv,#summary>table.kv{display:block;columns:3 280px;column-gap:28px}
#settings>table.kv>tbody,#summary>table.kv>tbody{display:block}
#settings>table.kv>tbody>tr,#summary>table.kv>tbody>tr{break-inside:avoid;display:table;width:100%}
#settings>table.kv>tbody>tr>th,#summary>table.kv>tbody>tr>th{width:50%}
table.kv{border-collapse:collapse}
table.kv td,table.kv th{padding:2px 10px 2px 0;vertical-align:top;text-align:left}
table.kv th{font-weight:normal;color:var(--muted);white-space:nowrap}
table.kv td.num{font-variant-numeric:tabular-nums}
table.kv table.kv{font-size:13px}
.notes{color:var(--fail)}
.subs{display:flex;flex-wrap:wrap;gap:8px 40px;margin-top:8px}
.sub h3{font-size:13px;margin:0 0 2px}
#curves{margin-bottom:12px}
.curve-grid{display:flex;flex-wrap:wrap;gap:10px}
figure.curve{margin:0;border:1px solid var(--line);border-radius:6px;background:#fff}
figure.curve svg{display:block}
.curve-title{font-size:12px;font-weight:600;fill:#1d2127}
.tick{font-size:10px;fill:var(--muted)}
.axis{stroke:#9aa0a6;stroke-width:1}
.series{fill:none;stroke:#1f5fbf;stroke-width:1.6}
figure.curve circle{fill:#1f5fbf}
#browser{display:grid;grid-template-columns:330px minmax(0,1fr);gap:16px;align-items:start}
#sidebar{position:sticky;top:8px;border:1px solid var(--line);border-radius:6px;background:#fff}
#filters{display:flex;flex-wrap:wrap;gap:6px;padding:8px;border-bottom:1px solid var(--line);background:var(--bg)}
#filters input[type=search]{flex:1 1 100%;padding:4px 6px}
#filters select{flex:1 1 45%;min-width:0}
#shown-count{color:var(--muted);flex:1 1 100%}
#episode-list{list-style:none;margin:0;padding:0;max-height:calc(100vh - 190px);overflow:auto}
.ep-row{display:flex;flex-wrap:wrap;column-gap:6px;padding:5px 8px;border-bottom:1px solid #eef0f2;cursor:pointer;align-items:baseline}
.ep-row:hover{background:var(--bg)}
.ep-row.selected{background:#e2ecff}
.ep-row .mark{font-weight:700;width:1em}
.ep-row.ok .mark{color:var(--ok)} .ep-row.fail .mark{color:var(--fail)}
.ep-row .what{flex:1;min-width:0;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.ep-row .extra{color:var(--muted);font-size:12px;white-space:nowrap;flex:1 1 100%;padding-left:calc(1em + 6px);overflow:hidden;text-overflow:ellipsis}
#pane{min-width:0}
#pane-toolbar{display:flex;flex-wrap:wrap;gap:8px;align-items:center;margin-bottom:8px}
#pane-toolbar button{padding:4px 12px;border:1px solid var(--line);background:#fff;border-radius:4px;cursor:pointer}
#pane-toolbar button.active{background:#1f5fbf;color:#fff;border-color:#1f5fbf}
#pane-body{display:grid;grid-template-columns:minmax(0,1fr);gap:12px}
#pane-body.split{grid-template-columns:minmax(0,1fr) minmax(0,1fr)}
.col{min-width:0;border:1px solid var(--line);border-radius:6px;padding:8px;background:#fff}
.ep-head h3{margin:0 0 4px;font-size:15px;overflow-wrap:anywhere}
.ep-meta{display:flex;flex-wrap:wrap;gap:4px 14px;margin:0 0 8px;color:var(--muted);font-size:12px}
.ep-meta b{color:#1d2127;font-weight:600}
.ep-meta .ok{color:var(--ok)} .ep-meta .fail{color:var(--fail)}
.msg{border-radius:8px;padding:6px 10px;margin:6px 0;max-width:92%}
.msg.env{background:var(--env);margin-right:auto}
.msg.agent{background:var(--agent);margin-left:auto;border:1px solid #cddcf7}
.msg.agent.kind-invalid,.msg.agent.kind-void{border-color:#e7b3b3;background:#fff3f3}
.who{font-size:11px;color:var(--muted);margin-bottom:2px}
.msg pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font:13px/1.4 ui-monospace,Menlo,Consolas,monospace}
.calls{margin-top:4px}
.call{font:12px ui-monospace,Menlo,Consolas,monospace;background:#fff;border:1px solid #cddcf7;border-radius:4px;padding:2px 6px;margin-top:3px;overflow-wrap:anywhere}
.call .fn{color:#1f5fbf;font-weight:700}
.turn-errors,.err{color:var(--fail);font-size:12px}
.msg img{display:block;image-rendering:pixelated;border:1px solid #ccc;margin:4px 0;max-width:100%;height:auto}
.tokens{font:12px/1.9 ui-monospace,Menlo,Consolas,monospace;white-space:pre-wrap;overflow-wrap:anywhere}
.tok{border-radius:2px;padding:0 1px}
.seg-break{display:block;border-top:1px dashed var(--muted);color:var(--muted);font:11px/1.6 system-ui,sans-serif;margin:8px 0 4px}
.legend{font-size:12px;color:var(--muted);margin-bottom:6px}
.legend .swatch{display:inline-block;width:28px;height:10px;vertical-align:middle;margin:0 4px}
.empty{color:var(--muted);padding:16px}
"""

SCRIPT = r"""
(function(){
"use strict";
const data = JSON.parse(document.getElementById("viewer-data").textContent);
const episodes = data.episodes;
const $ = (id) => document.getElementById(id);
const state = {selected: null, compare: null, view: "chat", colour: "mask"};
const textOf = {};

function el(tag, cls, text){ const e = document.createElement(tag); if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text; return e; }
function fmt(v){ if (v === null || v === undefined) return "n/a"; if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v); const a = Math.abs(v);
  if (a >= 100) return v.toFixed(0); if (a >= 1) return String(+v.toFixed(2)); if (a >= 0.001) return String(+v.toFixed(3));
  return v.toExponential(2); }
function article(i){ return document.getElementById("ep-" + i); }
function searchText(i){ if (!(i in textOf)) { const a = article(i); textOf[i] = a ? a.textContent.toLowerCase() : ""; }
  return textOf[i]; }

function fillSelect(select, values, any){ select.replaceChildren(el("option", "", any));
  select.firstChild.value = "";
  for (const v of values){ const o = el("option", "", String(v)); o.value = String(v); select.appendChild(o); }
  select.hidden = values.length < 2; }
const uniq = (xs) => Array.from(new Set(xs.filter((x) => x !== null && x !== undefined)));
fillSelect($("filter-reason"), uniq(episodes.map((e) => e.reason)).sort(), "any end reason");
fillSelect($("filter-task"), uniq(episodes.map((e) => e.task)).sort(), "any task");
fillSelect($("filter-step"), uniq(episodes.map((e) => e.step)).sort((a, b) => a - b), "any training step");

function visible(){
  const failed = $("failed-only").checked, reason = $("filter-reason").value, task = $("filter-task").value;
  const step = $("filter-step").value, q = $("search").value.trim().toLowerCase();
  return episodes.filter((e) => (!failed || !e.success) && (!reason || e.reason === reason) && (!task || e.task === task)
    && (!step || String(e.step) === step) && (!q || searchText(e.i).includes(q)));
}

function renderList(){
  const list = $("episode-list"), shown = visible();
  list.replaceChildren();
  for (const e of shown){
    const li = el("li", "ep-row " + (e.success ? "ok" : "fail"));
    li.dataset.i = e.i;
    li.appendChild(el("span", "mark", e.success ? "\u2713" : "\u2717"));
    li.appendChild(el("span", "what", e.task + (e.seed !== null ? " \u00b7 seed " + e.seed : "")));
    li.appendChild(el("span", "extra", (e.step !== null ? "step " + e.step + " \u00b7 " : "") + e.reason + " \u00b7 "
      + e.turns + (e.turns === 1 ? " turn" : " turns") + " \u00b7 " + fmt(e.score)));
    if (e.i === state.selected) li.classList.add("selected");
    li.addEventListener("click", () => select(e.i));
    list.appendChild(li);
  }
  $("shown-count").textContent = shown.length + " of " + episodes.length + " episodes";
  if (shown.length && !shown.some((e) => e.i === state.selected)) select(shown[0].i);
  if (!shown.length) { state.selected = null; renderPane(); }
}

function compareChoices(){
  const sel = $("compare-with"), cur = episodes[state.selected];
  sel.replaceChildren(el("option", "", "nothing"));
  sel.firstChild.value = "";
  if (!cur) { sel.disabled = true; return; }
  const same = episodes.filter((e) => e.task === cur.task && e.i !== cur.i);
  for (const e of same){
    const o = el("option", "", (e.success ? "\u2713 " : "\u2717 ") + (e.seed !== null ? "seed " + e.seed : "#" + e.i)
      + (e.step !== null ? " \u00b7 step " + e.step : "") + " \u00b7 " + e.reason);
    o.value = String(e.i); sel.appendChild(o);
  }
  sel.disabled = !same.length;
  sel.value = state.compare !== null && same.some((e) => e.i === state.compare) ? String(state.compare) : "";
}

function select(i){
  if (state.selected !== i) state.compare = null;
  state.selected = i;
  for (const li of document.querySelectorAll(".ep-row")) li.classList.toggle("selected", Number(li.dataset.i) === i);
  compareChoices();
  renderPane();
  if (history.replaceState) history.replaceState(null, "", "#ep-" + i);
}

function expand(runs){ const out = []; for (const [v, n] of runs || []) for (let k = 0; k < n; k++) out.push(v); return out; }

function tokenColour(mode, mask, lp, adv, maxAdv){
  if (mode === "mask") return mask > 0 ? "rgba(46,160,67,0.30)" : "rgba(120,120,120,0.12)";
  if (mask <= 0) return "rgba(120,120,120,0.10)";
  if (mode === "logprob"){ const t = Math.min(1, -lp / 5); return "rgba(215,48,39," + (0.08 + 0.8 * t).toFixed(3) + ")"; }
  const t = maxAdv > 0 ? Math.min(1, Math.abs(adv) / maxAdv) : 0;
  return (adv >= 0 ? "rgba(46,160,67," : "rgba(215,48,39,") + (0.08 + 0.8 * t).toFixed(3) + ")";
}

function legend(mode){
  const box = el("div", "legend");
  const parts = {mask: [["rgba(46,160,67,0.30)", "trained (loss mask 1)"], ["rgba(120,120,120,0.12)", "not trained: prompt, observations, forced tokens"]],
    logprob: [["rgba(215,48,39,0.08)", "log-prob near 0"], ["rgba(215,48,39,0.88)", "log-prob -5 or lower"], ["rgba(120,120,120,0.10)", "not trained"]],
    advantage: [["rgba(46,160,67,0.88)", "positive advantage"], ["rgba(215,48,39,0.88)", "negative advantage"], ["rgba(120,120,120,0.10)", "not trained"]]}[mode];
  for (const [c, t] of parts){ const s = el("span", "swatch"); s.style.background = c; box.appendChild(s); box.appendChild(document.createTextNode(t + "  ")); }
  return box;
}

function tokenView(i){
  const rec = data.tokens[String(i)];
  if (!rec) return el("p", "empty", "No token data for this episode: a trainer with save_rollouts: N keeps the loss mask, log-probs and advantages of the episodes it trained on.");
  const wrap = el("div", "token-view");
  wrap.appendChild(legend(state.colour));
  const mask = expand(rec.mask), adv = expand(rec.advantage), lps = rec.logprob || [];
  let maxAdv = 0; for (let k = 0; k < adv.length; k++) if (mask[k] > 0) maxAdv = Math.max(maxAdv, Math.abs(adv[k]));
  const box = el("div", "tokens");
  // an episode in segments (its history was rewritten): each later segment starts with a fresh prompt
  const starts = new Map(); let at = 0;
  (rec.segments || []).forEach((n, j) => { if (j) starts.set(at, j); at += n; });
  rec.tokens.forEach((text, k) => {
    if (starts.has(k)) box.appendChild(el("div", "seg-break", "segment " + (starts.get(k) + 1) + " of " + rec.segments.length + ": the history was rewritten; the model saw this prompt afresh"));
    const s = el("span", "tok", text);
    const m = mask[k] || 0, lp = lps[k] || 0, a = adv[k] || 0;
    s.style.background = tokenColour(state.colour, m, lp, a, maxAdv);
    s.dataset.mask = m;
    s.title = "loss mask " + m + " \u00b7 log-prob " + fmt(lp) + " \u00b7 advantage " + fmt(a);
    box.appendChild(s);
  });
  wrap.appendChild(box);
  return wrap;
}

function column(i){
  const col = el("div", "col");
  col.dataset.i = i;
  if (state.view === "tokens") {
    const head = article(i).querySelector(".ep-head");
    if (head) col.appendChild(head.cloneNode(true));
    col.appendChild(tokenView(i));
  } else {
    col.appendChild(article(i).cloneNode(true));
    col.firstChild.removeAttribute("id");
    col.firstChild.hidden = false;
  }
  return col;
}

function renderPane(){
  const body = $("pane-body");
  body.replaceChildren();
  for (const b of document.querySelectorAll("#pane-toolbar button[data-view]")) b.classList.toggle("active", b.dataset.view === state.view);
  $("token-colour").hidden = state.view !== "tokens";
  if (state.selected === null) { body.className = ""; body.appendChild(el("p", "empty", "No episode matches these filters.")); return; }
  body.appendChild(column(state.selected));
  if (state.compare !== null) body.appendChild(column(state.compare));
  body.className = state.compare !== null ? "split" : "";
}

for (const id of ["failed-only", "filter-reason", "filter-task", "filter-step"]) $(id).addEventListener("change", renderList);
$("search").addEventListener("input", renderList);
$("compare-with").addEventListener("change", (ev) => { state.compare = ev.target.value === "" ? null : Number(ev.target.value); renderPane(); });
$("token-colour").addEventListener("change", (ev) => { state.colour = ev.target.value; renderPane(); });
for (const b of document.querySelectorAll("#pane-toolbar button[data-view]")) b.addEventListener("click", () => { state.view = b.dataset.view; renderPane(); });

const fromHash = /^#ep-(\d+)$/.exec(location.hash);
if (fromHash && episodes[Number(fromHash[1])]) state.selected = Number(fromHash[1]);
renderList();
if (state.selected !== null) select(state.selected);
document.body.dataset.ready = "1";
})();
"""
