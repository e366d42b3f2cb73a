// The page's state, the bookkeeping that mirrors the server's text, and the views
// that render it. Panels register a view; renderAll() draws them in that order.
import { $ } from "./dom.js";

// A step's candidates depend only on the tokens before it, so steps are kept by the
// ids of that prefix: they stay valid after a step back, a branch or a cut, and let
// the branch tree bring a continuation back without asking the model again.
export const S = {
  info: null,
  textId: null,
  prompt: null, // the prompt string the current text was opened with
  promptLen: 0,
  tokens: [], // [{id, text, hex}] every known token (beyond `length`: stepped back from)
  length: 0,
  readUpto: 0, // positions the model has read (keys stored for 0..readUpto-1)
  serverSteps: new Set(), // positions whose step the server holds (branch by rank works there)
  memo: new Map(), // prefix key -> step JSON
  chosen: new Map(), // prefix key -> token id the user branched to
  paths: [], // the known token id sequences of this text, for the tree
  inside: new Map(), // "prefix key|token id" -> an inspect view (a few kept, newest last)
  ablations: new Map(), // the same key -> the latest rerun with parts switched off (ablate.js)
  selected: null,
  generating: false,
  busy: false,
};

export const keyAt = (p) => S.tokens.slice(0, p).map((t) => t.id).join(",");
export const stepAt = (p) => S.memo.get(keyAt(p));
export const temperature = () => Number($("temperature").value);
export const nLayer = () => (S.info ? S.info.config.n_layer : 0);

// The view from position p-1 predicts position p: it depends on the tokens before p
// and, for the chosen token's rank, on the token at p (absent when not chosen yet).
export const insideKey = (p) => keyAt(p) + "|" + (p < S.tokens.length ? S.tokens[p].id : "");
const INSIDE_KEPT = 12; // layers x heads x positions each: keep only the latest few
export function keepInside(p, view) {
  const key = insideKey(p);
  S.inside.delete(key);
  S.inside.set(key, view);
  while (S.inside.size > INSIDE_KEPT) S.inside.delete(S.inside.keys().next().value);
}

export function keepAblation(key, got) {
  S.ablations.delete(key);
  S.ablations.set(key, got);
  while (S.ablations.size > INSIDE_KEPT) S.ablations.delete(S.ablations.keys().next().value);
}

export function resetText() {
  Object.assign(S, { textId: null, prompt: null, promptLen: 0, tokens: [], length: 0, readUpto: 0, selected: null,
    serverSteps: new Set(), memo: new Map(), chosen: new Map(), paths: [], inside: new Map(), ablations: new Map() });
}

const tokenOf = (x) => ({ id: x.token_id, text: x.text, hex: x.bytes_hex || null });

// The server's text JSON is the truth; take it whole.
export function applyText(t) {
  S.textId = t.id;
  S.tokens = t.tokens.map(tokenOf);
  S.length = t.length;
  S.readUpto = t.read_upto ?? S.readUpto;
  S.serverSteps = new Set();
  for (const [p, step] of Object.entries(t.steps || {})) {
    const pos = Number(p);
    const old = S.memo.get(keyAt(pos));
    // A step recomputed when the text was reopened on another server: the page's own, as it
    // came with its requests, stays (and branches there go by token id, not by the new ranks).
    if (step.phase === "reopened" && old) continue;
    S.serverSteps.add(pos);
    S.memo.set(keyAt(pos), { ...old, ...step });
  }
  recordPath();
}

// What rebuilds the text on any server (POST /api/texts with `reopen`): every known token id,
// how many of them are the text (the rest stepped back from), and each position the model
// generated with its temperature and the controls it was generated with (the server recomputes
// their candidates after those controls, so they are the ones shown before).
export function rebuildBody() {
  const generated = [];
  for (let p = 1; p < S.tokens.length; p++) {
    const step = stepAt(p);
    if (!step) continue;
    const at = { position: p, temperature: Number(step.temperature ?? 1) };
    if (step.controls) at.controls = step.controls;
    generated.push(at);
  }
  return { prompt_ids: S.tokens.map((t) => t.id), reopen: { length: S.length, generated } };
}

// A token streamed in: the same bookkeeping the server does.
export function applyStep(step) {
  const p = step.position;
  const key = keyAt(p);
  if (p < S.tokens.length && S.tokens[p].id === step.token_id) {
    S.length = p + 1; // the same token as the one kept: what follows stays known
  } else {
    S.tokens = S.tokens.slice(0, p).concat([tokenOf(step)]);
    S.length = p + 1;
  }
  S.readUpto = Math.max(S.readUpto, p); // this step read every position before p
  // A live "look inside" is kept apart, bounded; what the server says of it goes with it.
  const { attention, lens, decided_layer, final_top1, attribution, neurons, ...rest } = step;
  S.memo.set(key, rest);
  S.serverSteps.add(p);
  if (attention || lens) {
    keepInside(p, { position: p, query_position: p - 1, attention, lens, decided_layer, final_top1, attribution, neurons, live: true, requests: [] });
  }
}

function recordPath() {
  const ids = S.tokens.map((t) => t.id);
  const texts = S.tokens.map((t) => t.text);
  const isPrefix = (a, b) => a.length <= b.length && a.every((x, i) => x === b[i]);
  if (S.paths.some((q) => isPrefix(ids, q.ids))) return;
  S.paths = S.paths.filter((q) => !isPrefix(q.ids, ids));
  S.paths.push({ ids, texts });
}

// --- views ---
const views = new Map();
export function view(name, fn) { views.set(name, fn); }
export function render(...names) { for (const n of names) { const fn = views.get(n); if (fn) fn(); } }
export function renderAll() { for (const fn of views.values()) fn(); }

// Select the token at position p: every view of "the selected token" follows.
export function select(p) {
  S.selected = p;
  document.querySelectorAll("#tokens .token.selected").forEach((el) => el.classList.remove("selected"));
  const el = document.querySelector(`#tokens .token[data-position="${p}"]`);
  if (el) el.classList.add("selected");
  render("candidates", "inside", "waterfall", "controls", "output-search");
}
