// The selected token's candidates: the answer of the final top-k search over the token
// vectors, with two kinds of probability kept apart. The model's own, over the whole
// vocabulary (p_all: its normaliser needs every logit, one more search over every token vector,
// asked once a step when its candidates open, counted in the waterfall), at T = 1 and at the
// slider's T; and the sampler's, renormalised over the top k at the slider's T. Both are
// recomputed here as the slider moves, with no request (the step keeps the whole vocabulary's
// normaliser at every temperature the slider offers).
import { api, textPath } from "./api.js";
import { branchTo, vocab } from "./actions.js";
import { $, clearAt, errorAt, failAt, h, labelled, placeholder, visibleToken } from "./dom.js";
import { int, logit, pct, probsAt } from "./format.js";
import { saveButton, tokenEvidence } from "./insight.js";
import { withText } from "./reopen.js";
import { chosenProb } from "./tokens.js";
import { S, keyAt, render, stepAt, temperature, view } from "./state.js";

const FOLDED = 5; // candidates shown until "show all"
let unfolded = false;
const asking = new Set(); // step keys whose probabilities over all tokens are being fetched
function badge(step) {
  const kind = step.read > 1 ? "prefill" : step.read === 1 ? "decode" : "replayed";
  return h("span", { class: "badge b-" + (kind === "replayed" ? "replay" : kind), text: kind });
}

function selHead(tok, p, step) {
  return h("div", { class: "sel-head" },
    h("span", { class: "sel-token" }, visibleToken(tok.text, tok.hex)),
    h("span", { class: "sel-meta", text: `position ${p} · token id ${tok.id}` }),
    step ? badge(step) : "");
}

function probCell(cls, rank) {
  return h("td", { class: "num prob " + cls, dataset: { rank: String(rank) } }, h("span", { class: "pbar" }), h("span", { class: "pval" }));
}
function setProb(td, p) {
  if (p === null || p === undefined) {
    td.querySelector(".pbar").style.width = "0%";
    td.querySelector(".pval").textContent = "…";
    return;
  }
  td.querySelector(".pbar").style.width = (Math.max(0, Math.min(1, p)) * 100).toFixed(1) + "%";
  td.querySelector(".pval").textContent = pct(p);
}

// A candidate's probability over all tokens at T, from the step's normaliser n_T there
// (p = exp((logit - n_T) / T); at T = 0, 1 for the best token): null when not known.
export function pAllAt(step, lg, T) {
  const all = step.over_all;
  if (!all) return null;
  const hit = all.normalisers.find(([t]) => Math.abs(t - T) < 1e-6);
  if (!hit) return null;
  return T === 0 ? (lg >= hit[1] ? 1 : 0) : Math.exp((lg - hit[1]) / T);
}

// The sampling's controls (penalties, bias): a step generated with them keeps each candidate's
// logit before them and which of them moved it; "logit" is then the one after, what the pick used.
const controlled = (step) => step.candidates.some((c) => c.logit_before !== undefined);
const SHORT = { repetition_penalty: "repetition", frequency_penalty: "frequency", presence_penalty: "presence", logit_bias: "bias" };
function controlCells(c) {
  const delta = c.logit - c.logit_before;
  return [h("td", { class: "num before", text: logit(c.logit_before) }),
    h("td", { class: "moved", text: c.moved.length ? `${c.moved.map((m) => SHORT[m] || m).join(" + ")} ${delta >= 0 ? "+" : "−"}${logit(Math.abs(delta))}` : "" })];
}

function candidateRow(c, i, position, current, controls) {
  const isChosen = c.token_id === current;
  return h("tr", { class: isChosen ? "chosen" : null, dataset: { rank: String(i), tokenId: String(c.token_id) }, hidden: !unfolded && i >= FOLDED },
    h("td", { class: "num rank", text: String(i + 1) }),
    h("td", { class: "tok" }, visibleToken(c.text, c.bytes_hex), h("span", { class: "tid", text: String(c.token_id) })),
    h("td", { class: "num logit", text: logit(c.logit) }),
    ...(controls ? controlCells(c) : []),
    probCell("p-all1", i),
    probCell("p-all", i),
    probCell("p-t", i),
    h("td", { class: "num cum", dataset: { rank: String(i) } }),
    h("td", { class: "act" },
      h("button", {
        type: "button", class: "branch", dataset: { rank: String(i), position: String(position) },
        disabled: isChosen || S.generating || S.busy,
        title: isChosen ? "this is the token at this position" : `Put “${c.text}” at position ${position} and continue generating`,
        onclick: () => branchTo(position, { rank: i, token_id: c.token_id }),
      }, isChosen ? "chosen" : "branch")));
}

function probHead(text, sub, extra) {
  return h("th", { class: "num", dataset: { label: extra.label || text }, title: extra.title },
    h("span", { class: "th-main", id: extra.id || null, text }),
    h("span", { class: "th-sub", text: sub }));
}

// The search the final vector made: exact over every token vector, or the approximate index.
const approximate = (step) => (step.request_log || []).some((r) => r.kind === "wte.ann");

function explain(step, tok, p, k) {
  const pc = chosenProb(step, tok.id);
  const V = int(vocab());
  return h("div", { class: "note cand-explain" },
    h("p", null, approximate(step)
      ? `The final vector asked the approximate index over the ${V} token vectors (wte.ann, “Next token: approximate”) for its ${k} best: the index may miss some of the true best, and each score it returns is exact. `
      : `The final vector searched the ${V} token vectors; these are the ${k} best, with their scores (logits). `,
    step.temperature === 0
      ? "It was generated at T = 0: the best candidate is always taken."
      : `It was sampled at T = ${step.temperature}, where the sampler gave this token p = ${pct(pc)}.`,
    S.chosen.get(keyAt(p)) === tok.id ? " You put it here with a branch." : "",
    p >= S.length ? " (Stepped back: branching from here steps forward first.)" : ""),
    controlled(step) ? h("p", { class: "cand-controls" }, h("b", { text: "Penalties and bias " }),
      "changed logits before the pick: “before” is the search's score, “logit” the one after, and the last column says which control moved it and by how much. " +
      `The candidates are the ${k} best after them over all ${V} tokens: a token they lift from far below is found too (its vector is scored in one more search).`) : "",
    h("p", null, h("b", { text: "Temperature " }), `reshapes the model's distribution over all ${V} tokens: `,
      h("code", { class: "all-formula", text: `p_T(i) = exp(logit_i / T) / Σ_j exp(logit_j / T), j over all ${V}` }),
      ". T = 1 is the model's own distribution; a lower T sharpens it, a higher one flattens it; T = 0 always takes the best."),
    h("p", null, h("b", { text: "Top-k " }), `is a second, separate step: the sampler keeps the k best and renormalises them to 100 %: `,
      h("code", { class: "softmax-formula", text: "p(i) = exp(logit_i / T) / Σ_j exp(logit_j / T), j over the top k" }),
      `, here k = ${k}. So the sampler's column is larger than the model's, by the share of the mass the other tokens hold.`),
    h("p", { class: "cand-mass" }));
}

// The shown candidates' share of the model's probability, at T = 1 and at the slider's T.
function massLine(step, k, T) {
  const at = (t) => step.candidates.reduce((a, c) => a + (pAllAt(step, c.logit, t) ?? 0), 0);
  if (!step.over_all) {
    return asking.has(keyAt(S.selected))
      ? "Asking for the probabilities over all tokens (one search over every token vector)…"
      : `The probabilities over all tokens are not known for this step (it was not generated on this server).`;
  }
  const m1 = at(1), mT = at(T);
  return `These ${k} hold ${pct(m1)} of the model's probability at T = 1 (over all ${int(step.over_all.n_vocab)} tokens)` +
    (T === 1 ? "" : ` and ${pct(mT)} at T = ${T.toFixed(2)}`) + `: the other ${int(step.over_all.n_vocab - k)} tokens hold the rest, and the sampler never picks them.`;
}

async function askOverAll(p, step) {
  const key = keyAt(p);
  if (step.over_all || asking.has(key) || !S.textId || !S.serverSteps.has(p)) return;
  asking.add(key);
  try {
    const got = await withText(() => api("POST", textPath(S.textId, `/steps/${p}/probabilities`), {}));
    const now = S.memo.get(key);
    if (now) S.memo.set(key, { ...now, candidates: got.candidates, over_all: got });
    clearAt("candidates|" + key);
  } catch (e) {
    failAt("candidates|" + key, e);
  } finally {
    asking.delete(key);
    render("candidates", "waterfall", "tokens"); // the text's shade becomes the model's own probability
  }
}

function foldButton(k) {
  return h("button", { type: "button", class: "cand-fold", "aria-expanded": String(unfolded),
    onclick: () => { unfolded = !unfolded; render("candidates"); } }, unfolded ? `show ${FOLDED}` : `show ${k}`);
}

function renderCandidates() {
  const box = $("candidates");
  const p = S.selected;
  if (p === null || p >= S.tokens.length) {
    box.replaceChildren(placeholder("Click a generated token to see the candidates the model chose it from."));
    return;
  }
  const tok = S.tokens[p];
  const step = p > 0 ? stepAt(p) : undefined;
  if (!step) {
    box.replaceChildren(selHead(tok, p),
      h("p", { class: "note", text: "This token is part of the prompt: the model read it, it did not choose it. " +
        "The whole prompt is read in one batched forward when the first token is generated; select that token to see its requests." }));
    return;
  }
  const T = temperature();
  const k = step.candidates.length;
  const V = int(vocab());
  const table = h("table", { class: "cand-table" + (unfolded ? "" : " folded") },
    h("thead", null, h("tr", null,
      h("th", { class: "num", text: "#" }),
      h("th", { text: "token" }),
      h("th", { class: "num", title: controlled(step) ? "the score the pick used: the search's, after the penalties and bias" : "the search score: the dot product of the final vector with the token's vector", text: "logit" }),
      ...(controlled(step) ? [h("th", { class: "num", title: "the search score, before the penalties and bias", text: "before" }),
        h("th", { title: "which control moved the logit, and by how much", text: "moved by" })] : []),
      probHead("p at T=1", `over all ${V} tokens`, { label: "p at T=1, over all", title: "the model's own probability: softmax of every logit" }),
      probHead(`p at T=${T.toFixed(2)}`, `over all ${V} tokens`, { id: "p-all-head", label: "p at the slider's T, over all", title: "the model's probability at the slider's temperature, over every token" }),
      probHead(`p at T=${T.toFixed(2)}`, `the sampler's, over the top ${k}`, { id: "p-temp-head", label: "the sampler's p, over the top k", title: `what the sampler draws from: the slider's T, renormalised over these ${k}` }),
      h("th", { class: "num", text: "cumulative", title: "the sampler's, summed from the best" }),
      h("th", { class: "act", dataset: { label: "" }, text: "" }))),
    h("tbody", null, step.candidates.map((c, i) => candidateRow(c, i, p, tok.id, controlled(step)))));
  const save = saveButton(() => [tokenEvidence("token", p), [], `The token at position ${p} and the ${k} candidates it was chosen from.`]);
  box.replaceChildren(selHead(tok, p, step), explain(step, tok, p, k), errorAt("candidates|" + keyAt(p)), h("div", { class: "actions save-row" }, save),
    h("div", { class: "table-scroll" }, labelled(table)), k > FOLDED ? h("div", { class: "actions cand-more" }, foldButton(k)) : "");
  updateProbs();
  askOverAll(p, step);
}

// The temperature slider: recomputed here from the stored logits and normalisers, no request.
export function updateProbs() {
  const rows = $("candidates").querySelectorAll("tbody tr");
  const step = S.selected === null ? undefined : stepAt(S.selected);
  if (!rows.length || !step) return;
  const T = temperature();
  const pT = probsAt(step.candidates.map((c) => c.logit), T);
  const set = (id, text) => { const el = $(id); if (el) el.textContent = text; };
  set("p-temp-head", `p at T=${T.toFixed(2)}`);
  set("p-all-head", `p at T=${T.toFixed(2)}`);
  let cum = 0;
  rows.forEach((tr, i) => {
    const c = step.candidates[i];
    cum += pT[i];
    setProb(tr.querySelector(".p-all1"), pAllAt(step, c.logit, 1) ?? c.p_all);
    setProb(tr.querySelector(".p-all"), pAllAt(step, c.logit, T));
    setProb(tr.querySelector(".p-t"), pT[i]);
    tr.querySelector(".cum").textContent = pct(Math.min(1, cum));
  });
  const mass = $("candidates").querySelector(".cand-mass");
  if (mass) mass.textContent = massLine(step, step.candidates.length, T);
}

export function initCandidates() { view("candidates", renderCandidates); }
