// What the buttons do: open a text, generate (streamed), stop, and the edits
// (step back, forward, cut, branch, go to a recorded branch). Each edit is one or
// more calls; the text JSON the server answers is taken whole. Every call about the
// text goes through withText: where the server does not hold it, it is reopened there.
import { api, stream, textPath } from "./api.js";
import { $, clearError, setNotice, setStatus, showError } from "./dom.js";
import { int, ms } from "./format.js";
import { withText } from "./reopen.js";
import { S, applyStep, applyText, keyAt, render, renderAll, resetText, select, temperature } from "./state.js";

function readNumber(id, lo, hi, name, fallback) {
  const raw = $(id).value.trim();
  if (raw === "") return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < lo || n > hi) throw new Error(`${name} must be a whole number from ${lo} to ${hi}`);
  return n;
}
export const vocab = () => (S.info ? S.info.config.n_vocab : 50257);
export const readTopK = () => readNumber("top-k", 1, vocab(), "Top-k", 40);

function readReal(id, lo, hi, name, fallback, open = false) {
  const raw = $(id).value.trim();
  if (raw === "") return fallback;
  const x = Number(raw);
  if (!Number.isFinite(x) || x < lo || x > hi || (open && x === lo)) throw new Error(`${name} must be a number from ${lo} to ${hi}`);
  return x;
}

// "50256=-100, 13=5" -> {"50256": -100, "13": 5}: token ids are the keys, as JSON sends them.
function readBias() {
  const out = {};
  for (const part of $("logit-bias").value.split(",").map((x) => x.trim()).filter(Boolean)) {
    const m = /^(\d+)\s*=\s*(-?[\d.]+)$/.exec(part);
    if (!m) throw new Error(`logit bias: write token id = bias, e.g. 50256=-100 (not “${part}”)`);
    out[m[1]] = Number(m[2]);
  }
  return out;
}

// The controls that move logits before the pick (sampling.py): sent only where set.
function controlsBody() {
  const body = {
    frequency_penalty: readReal("frequency-penalty", -2, 2, "Frequency penalty", 0),
    presence_penalty: readReal("presence-penalty", -2, 2, "Presence penalty", 0),
    repetition_penalty: readReal("repetition-penalty", 0, 100, "Repetition penalty", 1, true),
    min_p: readReal("min-p", 0, 1, "Min-p", 0),
    logit_bias: readBias(),
  };
  const unset = { frequency_penalty: 0, presence_penalty: 0, repetition_penalty: 1, min_p: 0 };
  for (const [k, v] of Object.entries(unset)) if (body[k] === v) delete body[k];
  if (!Object.keys(body.logit_bias).length) delete body.logit_bias;
  return body;
}

// The controls a sampling body sets (controlsBody's keys), as an insight records them.
const CONTROL_KEYS = ["min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"];
const controlsOf = (body) => Object.fromEntries(CONTROL_KEYS.filter((k) => k in body).map((k) => [k, body[k]]));

function samplingBody() {
  const body = {
    max_tokens: readNumber("max-tokens", 1, S.info ? S.info.max_new_tokens : 512, "Max tokens", 20),
    temperature: temperature(),
    top_k: readTopK(),
    seed: readNumber("seed", 0, Number.MAX_SAFE_INTEGER, "Seed", null),
    ...controlsBody(),
  };
  const how = $("output-search-mode").value; // exact, or the store's approximate index ("": the server's)
  if (how) body.output_search = how;
  if ($("inspect-live").checked) body.inspect = true; // attention and the lens with every token
  return body;
}

async function ensureText() {
  const prompt = $("prompt").value;
  if (!prompt.trim()) throw new Error("type a prompt first");
  if (S.textId && prompt === S.prompt) return;
  await openPrompt(prompt);
}

// A new text for this prompt (the old one is closed): the prompt box shows it.
// Open a new text from the prompt box's text, or from exact token ids (a reopened
// insight: the text is those tokens even where the tokenizer would split its text otherwise),
// with `reopen` the positions of them the model generated (the penalties count their tokens).
export async function openPrompt(prompt, ids = null, reopen = null) {
  $("prompt").value = prompt;
  const old = S.textId;
  resetText();
  setNotice("");
  renderAll();
  if (old) api("DELETE", textPath(old)).catch(() => {});
  const t = await api("POST", "/api/texts", ids ? { prompt_ids: ids, ...(reopen ? { reopen } : {}) } : { prompt });
  S.prompt = prompt;
  S.promptLen = t.length;
  applyText(t);
}

// The sampling each step was generated with, kept with the step: an insight saved
// from it carries it (insight.js).
function onToken(data, got, live, body) {
  applyStep(data);
  const step = S.memo.get(keyAt(data.position));
  if (step) {
    step.sampling = { temperature: body.temperature, top_k: body.top_k, seed: body.seed, ...controlsOf(body) };
    // The server draws a generation's tokens from one seeded stream, in turn: a seeded
    // token is drawn again only by the same generation from its start (notebook.js, Reopen).
    step.generation = { start: data.position - (got - 1) };
  }
  render("tokens", "phases");
  // Looking inside live: the panels follow the newest token.
  if (live || (S.selected === null && got === 1)) select(data.position);
  setStatus(`generating… ${got} token${got === 1 ? "" : "s"}`);
}

// One generation's stream on whichever server holds the text (reopened where none does):
// its `done` summary, or null when the stream ended without one.
async function streamed(body, seen) {
  let done = null;
  await withText(() => stream(textPath(S.textId, "/generate"), body, (event, data) => {
    if (event === "token") onToken(data, ++seen.got, !!body.inspect, body);
    else if (event === "done") {
      done = data;
      applyText(data.text);
    } else if (event === "error") {
      throw Object.assign(new Error(data.detail), { expired: data.code === "text_not_found" }); // reopened, carried on
    }
  }));
  return done;
}

// The generation, carried on where its server went away mid-stream: the text as a server has it
// now (reopened from the tokens that came, where none holds it), then the tokens still to come.
async function generation(body, first, seen) {
  try {
    return await streamed(body, seen);
  } catch (e) {
    if (!(e.lost || e.expired) || S.stopping) throw e;
    const why = e.expired ? "the text expired on the server" : "the server went away";
    setStatus(`${why} after ${seen.got} token${seen.got === 1 ? "" : "s"}: carrying on…`);
    await withText(async () => applyText(await api("GET", textPath(S.textId))));
    const left = body.max_tokens - (S.length - first);
    return left > 0 ? streamed({ ...body, max_tokens: left }, seen) : null;
  }
}

export async function generate(opts = {}) {
  if (S.generating) return;
  clearError();
  let body;
  try { body = { ...samplingBody(), ...(opts.sampling || {}) }; } catch (e) { showError(e); return; }
  S.generating = true;
  S.stopping = false;
  render("controls");
  setStatus("generating…");
  let first = null;
  const seen = { got: 0 };
  try {
    if (!opts.keepText) await ensureText();
    first = S.length;
    renderAll();
    const done = await generation(body, first, seen);
    const got = S.length - first;
    if (done) {
      setStatus(`${got} token${got === 1 ? "" : "s"} · ${int(done.requests)} requests · ${ms(done.ms)}${done.stopped ? " · stopped" : ""}`);
    } else { // the stream ended with no summary (stopped): take the text as the server has it
      await withText(async () => applyText(await api("GET", textPath(S.textId))));
      setStatus(`${seen.got} token${seen.got === 1 ? "" : "s"} · ${S.stopping ? "stopped" : "the stream ended early"}`);
    }
  } catch (e) {
    showError(e);
    setStatus("");
  } finally {
    S.generating = false;
    if (S.selected !== null && S.selected >= S.tokens.length) S.selected = null;
    if (S.selected === null && first !== null && first < S.length) S.selected = first;
    renderAll();
  }
}

export async function stop() {
  if (!S.textId || !S.generating) return;
  S.stopping = true;
  setStatus("stopping…"); // before the request: the stream's `done` may come back first
  try {
    await api("POST", textPath(S.textId, "/stop"));
  } catch (e) {
    if (e.code !== "text_not_found") showError(e); // a server without the text runs nothing to stop
  }
}

// An edit: one or more calls, then the text as the server has it.
async function edit(fn) {
  if (!S.textId || S.generating || S.busy) return false;
  clearError();
  S.busy = true;
  render("controls");
  try {
    await fn();
    return true;
  } catch (e) {
    showError(e);
    return false;
  } finally {
    S.busy = false;
    if (S.selected !== null && S.selected >= S.tokens.length) S.selected = null;
    renderAll();
  }
}
// One edit of the text, on whichever server holds it; body() is read when the call is made.
const call = (op, body) => withText(async () =>
  applyText(await api("POST", textPath(S.textId, "/" + op), typeof body === "function" ? body() : body)));

export const stepBack = () => edit(() => call("step_back", { position: S.length - 1 }));
export const stepForward = () => edit(() => call("step_forward", { position: S.length + 1 }));

export async function cut() {
  const p = S.selected;
  if (p === null) return;
  await edit(async () => {
    await call("cut", { position: p });
    S.selected = p - 1 >= 0 ? p - 1 : null;
  });
}

// Branch at position p to the candidate of that rank, then keep generating.
export async function branchTo(p, { rank, token_id }) {
  const key = keyAt(p);
  const ok = await edit(async () => {
    if (p > S.length) await call("step_forward", { position: p });
    // By rank where the server holds the step; by token id where only this page does.
    await call("branch", () => (S.serverSteps.has(p) && rank !== undefined ? { position: p, rank } : { position: p, token_id }));
    S.chosen.set(key, token_id);
    S.selected = p;
  });
  if (ok) await generate({ keepText: true });
}

// Move to a recorded continuation: branch at the first token that differs, then put
// the rest back (no search: the model reads them, in one batch, when it next generates).
export async function goToPath(path) {
  const { ids, texts } = path;
  await edit(async () => {
    const cur = S.tokens.map((t) => t.id);
    let d = 0;
    while (d < Math.min(cur.length, ids.length) && cur[d] === ids[d]) d++;
    if (d >= ids.length) { // the path is what the text knows already: step there, for free
      if (ids.length < S.length) await call("step_back", { position: ids.length });
      else if (ids.length > S.length) await call("step_forward", { position: ids.length });
      return;
    }
    if (d > S.length) await call("step_forward", { position: d });
    const key = keyAt(d);
    await call("branch", { position: d, token_id: ids[d] });
    S.chosen.set(key, ids[d]);
    S.selected = d;
    // The rest in one append; where the tokenizer would split its text differently,
    // the recorded tokens are put back one by one (a branch at the end of the text).
    const rest = texts.slice(d + 1).join("");
    if (rest) {
      try { await call("append", { text: rest }); } catch (_) { /* the text is left as it was; put them back one by one */ }
    }
    let m = d + 1;
    while (m < ids.length && m < S.length && S.tokens[m].id === ids[m]) m++;
    for (let q = m; q < ids.length; q++) await call("branch", { position: q, token_id: ids[q] });
    if (S.length > ids.length) await call("cut", { position: ids.length });
  });
}

// Put token_id at position p (where a step is): the text ends there.
export async function putTokenAt(p, tokenId) {
  return edit(async () => {
    await call("branch", { position: p, token_id: tokenId });
    if (S.length > p + 1) await call("cut", { position: p + 1 });
    S.selected = p;
  });
}
