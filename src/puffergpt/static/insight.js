// "Save as insight": a short form (title, your words, tags) with the evidence of what
// you were looking at attached and shown before saving. The evidence has exactly the
// shape the notebook checks (puffergpt/notebook/checks.py, check_evidence), so that the
// notebook can replay it: the candidates are the model's scores for the token at
// `position` having read prompt_ids[:position].
import { api } from "./api.js";
import { $, h } from "./dom.js";
import { S, stepAt } from "./state.js";

const SHOWN_CANDIDATES = 10; // listed in the readable evidence; the rest are counted

// --- the evidence -----------------------------------------------------------------

// The sampling a step was generated with, its controls too: the page records it as it generates
// (actions.js); a step it did not generate here (a reopened text's) falls back to what it carries
// (its temperature, and the controls its JSON names).
function samplingOf(step) {
  if (step.sampling) return { ...step.sampling };
  return { temperature: step.temperature ?? 1, top_k: Math.max(1, step.candidates.length), seed: null, ...(step.controls || {}) };
}

const CONTROLS = ["min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias"];
const hasControls = (s) => CONTROLS.some((k) => k in s);

// The positions before p the model generated (those with a step, as a reopen sends them: state.js,
// rebuildBody): the presence and frequency penalties count their tokens, so an insight with controls
// records them to replay.
const generatedBefore = (p) => Array.from({ length: Math.max(0, p - 1) }, (_, i) => i + 1).filter((q) => stepAt(q));

// Scalars only: the notebook keeps each request as a flat record.
const requestsOf = (step) => (step.request_log || []).map((r) => Object.fromEntries(
  Object.entries(r).filter(([, v]) => v === null || ["string", "number", "boolean"].includes(typeof v))));

// Where the step at p was not generated (a prompt token looked inside), its candidates
// are the lens's last row: the model's own final search for that token.
function finalLens(view) {
  const last = view && view.lens && view.lens[view.lens.length - 1];
  if (!last) return null;
  const top = Array.isArray(last) ? last : last.top;
  return top.map((t) => ({ token_id: t.token_id, logit: t.logit }));
}

// The common part, for the selected token p; throws with what to do when there is none.
export function tokenEvidence(kind, p = S.selected, view = null) {
  if (!S.info) throw new Error("the model's details are still loading: try again in a moment");
  if (!S.textId || p === null || p === undefined || p < 1 || p >= S.tokens.length) {
    throw new Error("select a generated token first: an insight's evidence is the model's scores for one token of your text");
  }
  const step = stepAt(p);
  const candidates = step ? step.candidates.map((c) => ({ token_id: c.token_id, logit: c.logit })) : finalLens(view);
  if (!candidates || !candidates.length) {
    throw new Error(`the token at position ${p} was read, not generated: generate it, or look inside it, to have scores to save`);
  }
  // The text as it is (tokens[:length]); a token stepped back from still has its prefix.
  const n = Math.max(S.length, p + 1);
  const ev = {
    kind, model: S.info.model,
    prompt_ids: S.tokens.slice(0, n).map((t) => t.id),
    position: p, token_id: S.tokens[p].id,
    sampling: step ? samplingOf(step) : { temperature: 0, top_k: candidates.length, seed: null },
    candidates,
  };
  if (hasControls(ev.sampling)) ev.generated = generatedBefore(p);
  const requests = step ? requestsOf(step) : [];
  if (requests.length) ev.requests = requests;
  if (step && step.generation) ev.data = { generation: { start: step.generation.start } };
  return ev;
}

// Evidence with the data of its kind added to what tokenEvidence put there.
export const withData = (ev, data) => ({ ...ev, data: { ...(ev.data || {}), ...data } });

// --- the evidence, readable ----------------------------------------------------------

// texts: {prompt: what the model had read, as a string; token: id -> its text} (either
// may lack an entry: ids are shown alone then).
export function readable(ev, texts) {
  const tok = (id) => (texts.token.has(id) ? `${id} ${JSON.stringify(texts.token.get(id))}` : String(id));
  const s = ev.sampling;
  const lines = [
    `kind: ${ev.kind}`, `model: ${ev.model}`,
    `position ${ev.position}: token ${tok(ev.token_id)}`,
    `sampling: temperature ${s.temperature}, top-k ${s.top_k}, seed ${s.seed === null ? "none" : s.seed}`,
    ...(hasControls(s) ? [`controls: ${CONTROLS.filter((k) => k in s).map((k) => `${k} ${JSON.stringify(s[k])}`).join(", ")}` +
      (ev.generated ? `; the penalties count the tokens the model generated at ${ev.generated.length ? "positions " + ev.generated.join(", ") : "no position before it"}` : "")] : []),
    "", `What the model had read (${ev.position} tokens):`,
    // as a JSON string: its spaces and new lines are seen, and nothing ends the block
    texts.prompt === null ? `token ids ${ev.prompt_ids.slice(0, ev.position).join(" ")}` : JSON.stringify(texts.prompt),
    "", `Its ${ev.candidates.length} candidates, best first:`,
    ...ev.candidates.slice(0, SHOWN_CANDIDATES).map((c, i) => `${String(i + 1).padStart(3)}. logit ${c.logit.toFixed(4).padStart(9)}  token ${tok(c.token_id)}`),
  ];
  if (ev.candidates.length > SHOWN_CANDIDATES) lines.push(`     … and ${ev.candidates.length - SHOWN_CANDIDATES} more`);
  if (ev.requests) lines.push("", `The ${ev.requests.length} requests that produced them.`);
  if (ev.data) lines.push("", ...dataLines(ev.kind, ev.data, tok));
  const lesson = ev.data && ev.data.lesson;
  if (lesson) lines.push("", `From the lesson ${JSON.stringify(lesson.title)}, step ${lesson.step} (${lesson.step_title}):`,
    `${lesson.holds ? "holds" : "does not hold"}: ${lesson.claim}`);
  const g = ev.data && ev.data.generation;
  if (g) lines.push("", `Generated by a generation that began at position ${g.start}` + (s.seed === null ? "." : ` with seed ${s.seed}: Reopen draws it again from there.`));
  return lines.join("\n");
}

function dataLines(kind, d, tok) {
  if (kind === "attention") {
    const order = d.weights.map((_, j) => j).sort((a, b) => d.weights[b] - d.weights[a]).slice(0, 5);
    return [`Attention: layer ${d.layer}, head ${d.head}, over ${d.weights.length} positions; most weight on`,
      ...order.map((j) => `  position ${j}: ${(d.weights[j] * 100).toFixed(1)}%`)];
  }
  if (kind === "lens") {
    return [`The lens at layer ${d.layer}, best first:`,
      ...d.ids.map((id, i) => `  ${i + 1}. logit ${d.logits[i].toFixed(4)}  token ${tok(id)}`)];
  }
  if (kind === "attribution") {
    const name = (x) => (x.kind === "attn" ? `L${x.layer} H${x.head}` : x.kind === "attn_bias" ? `L${x.layer} attn bias` : x.kind === "mlp" ? `L${x.layer} MLP` : x.kind === "embed" ? "embed" : "ln_f bias");
    const top = (parts) => [...parts].sort((a, b) => Math.abs(b.value) - Math.abs(a.value)).slice(0, 5).map((x) => `  ${name(x)}: ${x.value >= 0 ? "+" : ""}${x.value.toFixed(4)}`);
    const out = [`What each part adds to token ${tok(d.token_id)} (logit ${d.logit.toFixed(4)}): ${d.parts.length} parts, the largest`, ...top(d.parts)];
    if (d.versus) out.push(`Why it and not token ${tok(d.versus.token_id)} (logit ${d.versus.logit.toFixed(4)}): the largest parts of the difference`, ...top(d.versus.parts));
    return out;
  }
  if (kind === "ablation") {
    return [`Run again with ${d.parts.join(", ")} switched off at every position; the candidates after, best first:`,
      ...d.after.slice(0, SHOWN_CANDIDATES).map((c, i) => `  ${i + 1}. logit ${c.logit.toFixed(4)}  token ${tok(c.token_id)}`)];
  }
  if (kind === "analogy") {
    const [a, b, c] = d.terms;
    return [`Analogy: ${JSON.stringify(a)} is to ${JSON.stringify(b)} as ${JSON.stringify(c)} is to ?  (one search for wte[B] - wte[A] + wte[C])`,
      ...d.ids.map((id, i) => `  ${i + 1}. cosine ${d.scores[i].toFixed(4)}  token ${tok(id)}`)];
  }
  return [];
}

// The texts the page knows: the text's tokens and the selected step's candidates.
function pageTexts(ev, extra) {
  const token = new Map(S.tokens.map((t) => [t.id, t.text]));
  const step = stepAt(ev.position);
  for (const c of (step && step.candidates) || []) token.set(c.token_id, c.text);
  for (const [id, text] of extra || []) token.set(id, text);
  // The page's text, where it is the one the evidence read (a lesson's step may be saved before its view opens)
  const known = S.tokens.slice(0, ev.position);
  const same = known.length === ev.position && known.every((t, i) => t.id === ev.prompt_ids[i]);
  return { prompt: same ? known.map((t) => t.text).join("") : null, token };
}

// --- the form ----------------------------------------------------------------------

let pending = null; // the evidence the open form will save
// A save's Idempotency-Key (getRandomValues: randomUUID needs https): a retry after a failure sends
// the same one, and gets the insight that save wrote, never a second one.
const newKey = () => Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
let saveKey = newKey();
let onSaved = () => {};
export function whenSaved(fn) { onSaved = fn; }

const tagsOf = (s) => s.split(/[\s,]+/).filter(Boolean);

function open(evidence, texts, what) {
  pending = evidence;
  saveKey = newKey(); // one save: a retry after a failure sends it again
  $("insight-what").textContent = what;
  $("insight-evidence").textContent = readable(evidence, texts);
  $("insight-json").textContent = JSON.stringify(evidence, null, 1);
  $("insight-result").replaceChildren();
  $("insight-save").disabled = false;
  const dlg = $("insight-dialog");
  if (!dlg.open) dlg.showModal();
  $("insight-title").focus();
}

async function save() {
  const result = $("insight-result");
  const title = $("insight-title").value;
  if (!title.trim()) { result.replaceChildren(h("p", { class: "emb-error", role: "alert", text: "Give the insight a title." })); return; }
  $("insight-save").disabled = true;
  result.replaceChildren(h("p", { class: "placeholder", text: "saving and committing…" }));
  try {
    const r = await api("POST", "/api/insights", { title, body: $("insight-body").value, tags: tagsOf($("insight-tags").value), evidence: pending },
      { "Idempotency-Key": saveKey });
    result.replaceChildren(h("p", { class: "insight-saved" },
      "Saved as ", h("code", { class: "insight-path", text: r.path }), " in the notebook, commit ",
      h("code", { class: "insight-commit", title: r.commit || "", text: r.commit ? r.commit.slice(0, 12) : "none" }), "."));
    for (const id of ["insight-title", "insight-body", "insight-tags"]) $(id).value = "";
    saveKey = newKey(); // the next save is another insight
    onSaved(r);
  } catch (e) {
    $("insight-save").disabled = false;
    result.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message }));
  }
}

// A "Save as insight" button: build() returns [evidence, extra token texts, what it is]
// or throws with what to do (shown next to the button).
export function saveButton(build, label = "Save as insight") {
  const msg = h("span", { class: "save-msg", role: "status" });
  const button = h("button", {
    type: "button", class: "save-insight", title: "Save what you see, in your own words, to the notebook (a git repository)",
    onclick: () => {
      msg.textContent = "";
      let got;
      try { got = build(); } catch (e) { msg.textContent = e.message; return; }
      const [ev, extra, what] = got;
      open(ev, pageTexts(ev, extra), what);
    },
  }, label);
  return h("span", { class: "save-wrap" }, button, msg);
}

export function initInsightForm() {
  $("insight-form").addEventListener("submit", (e) => { e.preventDefault(); save(); });
  $("insight-cancel").addEventListener("click", () => $("insight-dialog").close());
}
