// Where is the answer? Activation patching (POST /api/patching/propose, then POST /api/patching
// as server-sent events; lens/patching.py). Two prompts of the same number of tokens: the clean
// one and a corrupted one. For each layer and position, the residual entering that block (the
// last row: entering ln_f) is copied from the clean run into the corrupted run, and the cell says
// how much of logit(answer) - logit(wrong) comes back: 1 all of it, 0 none. The heads mode does
// the same with each head's output at the last position. Each cell is a forward pass of searches.
import { api, stream } from "./api.js";
import { $, h, streamToken, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { S } from "./state.js";

const COPY = "a = 7\nb = 3\nc = 9\na = 7\nb =";
export const PATCH_STARTERS = [
  { kind: "copy: the value to copy changed", clean: COPY, corrupt: COPY.replace("b = 3", "b = 5") },
  // the repeated line's value changed: line 4 no longer repeats line 1, and the model stops copying
  { kind: "one earlier token decides", clean: COPY, corrupt: "a = 7\nb = 3\nc = 9\na = 5\nb =" },
];
const AUTO_RUNS = 120; // a lesson opens the view and runs it at once when it costs at most this many passes

let proposal = null; // the last /propose answer, for the prompts it was asked for
let running = null; // {controller, stopped}
let shown = null; // what the grid shows: {mode, tokens, rows, base, done, runs, requests, stopped}

const form = () => ({ clean: $("patch-clean").value, corrupt: $("patch-corrupt").value });
const nLayer = () => (S.info ? S.info.config.n_layer : 0);
const nHead = () => (S.info ? S.info.config.n_head : 0);

function say(box, text, cls = "note") { box.replaceChildren(h("p", { class: cls, text })); }

// r as a colour: blue where the patch brings the answer back, red where it pushes it further away.
export function restoredColour(r) {
  if (r === null || r === undefined) return "transparent";
  const a = Math.min(1, Math.abs(r));
  return r >= 0 ? `rgba(79, 70, 229, ${(0.08 + 0.85 * a).toFixed(3)})` : `rgba(220, 38, 38, ${(0.08 + 0.85 * a).toFixed(3)})`;
}

async function propose() {
  const { clean, corrupt } = form();
  const cost = $("patch-cost");
  proposal = null;
  say(cost, "reading both prompts…", "placeholder");
  try {
    const p = await api("POST", "/api/patching/propose", { clean, corrupt });
    proposal = { ...p, asked: { clean, corrupt } }; // the prompts it was asked for
    $("patch-answer").value = p.answer.text;
    $("patch-wrong").value = p.wrong.text;
    showCost();
    return p;
  } catch (e) {
    say(cost, e.message, "emb-error");
    return null;
  } finally {
    renderButtons();
  }
}

function showCost() {
  const cost = $("patch-cost");
  if (!proposal) { cost.replaceChildren(); return; }
  const mode = $("patch-mode").value;
  cost.replaceChildren(h("p", { class: "note" },
    `${plural(proposal.clean.length, "token")} each. The clean run's top choice `, visibleToken(proposal.answer.text, proposal.answer.bytes_hex),
    " is proposed as the answer, the corrupted run's ", visibleToken(proposal.wrong.text, proposal.wrong.bytes_hex),
    ` as the wrong token. This mode costs ${int(proposal.runs[mode])} forward passes (the two runs, then one a cell), each a prefill of searches.`));
}

function renderButtons() {
  $("patch-run").disabled = !!running;
  $("patch-stop").disabled = !running;
  $("patch-check").disabled = !!running;
}

function onEvent(event, data) {
  if (event === "start") {
    shown.base = data;
    shown.runs = data.runs;
  } else if (event === "run") {
    const row = shown.rows[data.layer];
    row[shown.mode === "positions" ? data.position : data.head] = data.restored;
    shown.done = data.done;
    shown.requests = data.requests;
  } else if (event === "done") {
    shown.done = data.runs;
    shown.requests = data.requests;
    shown.stopped = data.stopped;
    shown.finished = true;
  } else if (event === "error") throw new Error(data.detail);
  renderGrid();
}

export async function runPatching() {
  if (running) return;
  const { clean, corrupt } = form();
  const mode = $("patch-mode").value;
  if (!proposal || proposal.asked.clean !== clean || proposal.asked.corrupt !== corrupt) {
    if (!await propose()) return;
  }
  const cols = mode === "positions" ? proposal.clean.length : nHead();
  const rows = Array.from({ length: nLayer() + (mode === "positions" ? 1 : 0) }, () => Array(cols).fill(null));
  shown = { mode, tokens: proposal.clean, corrupt: proposal.corrupt, rows, base: null, done: 0, runs: proposal.runs[mode],
    requests: 0, stopped: false, finished: false, answer: $("patch-answer").value, wrong: $("patch-wrong").value };
  running = { controller: new AbortController(), stopped: false };
  try {
    renderButtons();
    renderGrid();
    await stream("/api/patching", { clean, corrupt, answer: shown.answer, wrong: shown.wrong, mode },
      onEvent, running.controller.signal);
  } catch (e) {
    if (!running.stopped) say($("patch-cost"), e.message, "emb-error");
  } finally {
    if (running.stopped) shown.stopped = true;
    running = null;
    renderButtons();
    renderGrid();
  }
}

function stop() {
  if (!running) return;
  running.stopped = true;
  running.controller.abort(); // the server stops within a run; the cells so far stand
}

// A cell's number: two decimals without the leading zero, none where it is 0 to two decimals.
const shortNumber = (r) => (r === null || Math.abs(r) < 0.005 ? "" : r.toFixed(2).replace(/^(-?)0\./, "$1."));

function axisLabel(t, i) {
  return h("span", { class: "patch-axis", title: `position ${i}: ${JSON.stringify(t.text)}`, dataset: { position: String(i) } },
    streamToken(t.text, t.bytes_hex));
}

// The grid: a row a layer (positions mode: the residual entering block l, the last entering
// ln_f; heads mode: each head at the last position), a column a position (the clean prompt's
// tokens along the top) or a head.
function grid() {
  const L = nLayer(), pos = shown.mode === "positions";
  const cols = shown.rows[0].length;
  const style = { gridTemplateColumns: `2.6rem repeat(${cols}, minmax(0, 1fr))` };
  const head = h("div", { class: "patch-row patch-head", style }, h("span", { class: "patch-layer", text: pos ? "layer" : "" }),
    pos ? shown.tokens.map(axisLabel) : Array.from({ length: cols }, (_, hd) => h("span", { class: "patch-axis", text: `H${hd}` })));
  const rows = shown.rows.map((row, l) => h("div", { class: "patch-row", style, dataset: { layer: String(l) } },
    h("span", { class: "patch-layer", text: pos && l === L ? "ln_f" : `L${l}` }),
    row.map((r, c) => h("span", {
      class: "patch-cell" + (r === null ? " patch-empty" : ""), style: { background: restoredColour(r) },
      dataset: { layer: String(l), [pos ? "position" : "head"]: String(c), restored: r === null ? "" : r.toFixed(4) },
      title: r === null ? "not run" : `${pos ? (l === L ? "entering ln_f" : `entering block ${l}`) + `, position ${c}` : `layer ${l}, head ${c}`}: ${(100 * r).toFixed(1)}% of the answer's lead restored`,
    }, h("span", { class: "patch-num", text: shortNumber(r) })))));
  return h("div", { class: "patch-grid", role: "img", "aria-label": "how much of the answer each patch restores" }, head, rows);
}

// The cell that restores most, outside the trivial last row: what the grid says, in words.
function reading() {
  const pos = shown.mode === "positions", L = nLayer();
  let best = null;
  shown.rows.forEach((row, l) => row.forEach((r, c) => {
    if (r === null || (pos && l === L)) return;
    if (!best || r > best.r) best = { l, c, r };
  }));
  if (!best) return "";
  if (!pos) return `Head L${best.l} H${best.c}'s output alone brings back ${(100 * best.r).toFixed(0)}% of the answer's lead.`;
  const t = shown.tokens[best.c];
  return `Patched at position ${best.c} (${JSON.stringify(t.text)}) entering block ${best.l}, ${(100 * best.r).toFixed(0)}% of the answer's lead comes back: the information that decides it sits there then.`;
}

function renderGrid() {
  const box = $("patch-result");
  if (!shown) { box.replaceChildren(); return; }
  const b = shown.base;
  const progress = h("div", { class: "patch-progress" },
    h("progress", { max: String(shown.runs), value: String(shown.done) }),
    h("span", { class: "status", text: `${int(shown.done)} of ${plural(shown.runs, "forward pass", "forward passes")}` +
      ` · ${plural(shown.requests, "request")}` + (running ? " · running…" : shown.stopped ? " · stopped" : shown.finished ? " · done" : "") }));
  box.replaceChildren(progress,
    b ? h("p", { class: "note" }, "d = logit(", visibleToken(shown.answer, null), ") − logit(", visibleToken(shown.wrong, null),
      `): clean ${b.clean_diff.toFixed(3)}, corrupted ${b.corrupt_diff.toFixed(3)}. Each cell: (d patched − corrupted) / (clean − corrupted).`) : "",
    grid(),
    h("p", { class: "patch-reading", text: reading() }));
}

// Put prompts (and tokens) in the form; a lesson opens the view this way and runs it when cheap.
export async function openPatching({ clean, corrupt, answer = null, wrong = null, mode = "positions", run = true }) {
  $("patch-clean").value = clean;
  $("patch-corrupt").value = corrupt;
  $("patch-mode").value = mode;
  const p = await propose();
  if (!p) return;
  if (answer) $("patch-answer").value = answer;
  if (wrong) $("patch-wrong").value = wrong;
  if (run && p.runs[mode] <= AUTO_RUNS) await runPatching();
}

function renderStarters() {
  $("patch-starters").replaceChildren(...PATCH_STARTERS.map((s) => h("button", {
    type: "button", class: "starter", title: `${s.clean}\n— corrupted —\n${s.corrupt}`,
    onclick: () => openPatching({ ...s, run: false }),
  }, h("span", { class: "starter-kind", text: s.kind }), h("span", { class: "starter-text", text: s.corrupt }))));
}

export function initPatching() {
  renderStarters();
  $("patch-form").addEventListener("submit", (e) => { e.preventDefault(); runPatching(); });
  $("patch-check").addEventListener("click", () => propose());
  $("patch-stop").addEventListener("click", stop);
  $("patch-mode").addEventListener("change", showCost);
  renderButtons();
}
