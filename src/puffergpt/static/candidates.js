// The selected token's candidates: the answer of the final top-k search over the
// token vectors, with probabilities among those k, at T = 1 and at the slider's T
// (recomputed here from the stored logits, with no request).
import { branchTo, vocab } from "./actions.js";
import { $, h, labelled, placeholder, visibleToken } from "./dom.js";
import { int, logit, pct, probsAt } from "./format.js";
import { saveButton, tokenEvidence } from "./insight.js";
import { chosenProb } from "./tokens.js";
import { S, keyAt, stepAt, temperature, view } from "./state.js";

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
  td.querySelector(".pbar").style.width = (Math.max(0, Math.min(1, p)) * 100).toFixed(1) + "%";
  td.querySelector(".pval").textContent = pct(p);
}

function candidateRow(c, i, position, p1, current) {
  const isChosen = c.token_id === current;
  const tr = h("tr", { class: isChosen ? "chosen" : null, dataset: { rank: String(i), tokenId: String(c.token_id) } },
    h("td", { class: "num rank", text: String(i + 1) }),
    h("td", { class: "tok" }, visibleToken(c.text, c.bytes_hex), h("span", { class: "tid", text: String(c.token_id) })),
    h("td", { class: "num", text: logit(c.logit) }),
    probCell("p-t1", i),
    probCell("p-t", i),
    h("td", { class: "num cum", dataset: { rank: String(i) } }),
    h("td", { class: "act" },
      h("button", {
        type: "button", class: "branch", dataset: { rank: String(i), position: String(position) },
        disabled: isChosen || S.generating || S.busy,
        title: isChosen ? "this is the token at this position" : `Put “${c.text}” at position ${position} and continue generating`,
        onclick: () => branchTo(position, { rank: i, token_id: c.token_id }),
      }, isChosen ? "chosen" : "branch")));
  setProb(tr.children[3], p1);
  return tr;
}

function probHead(text, k, extra) {
  return h("th", { class: "num", dataset: { label: extra.id ? "p at the slider's T" : text }, ...extra, id: null },
    h("span", { class: "th-main", id: extra.id ? extra.id : null, text }),
    h("span", { class: "th-sub", text: `among these ${k}` }));
}

function explain(step, tok, p, k) {
  const pc = chosenProb(step, tok.id);
  return h("p", { class: "note" },
    `The final vector searched the ${int(vocab())} token vectors; these are the ${k} best, with their scores (logits). `,
    `Probabilities are a softmax over these ${k} candidates only, at temperature T: `,
    h("code", { class: "softmax-formula", text: "p(i) = exp(logit_i / T) / Σ_j exp(logit_j / T)" }),
    ` (j over the ${k}; T = 1 is the model's own distribution, a lower T sharpens it, a higher one flattens it, T = 0 always takes the best). `,
    step.temperature === 0
      ? "It was generated at T = 0: the best candidate is always taken."
      : `It was sampled at T = ${step.temperature}, where this token had p = ${pct(pc)}.`,
    S.chosen.get(keyAt(p)) === tok.id ? " You put it here with a branch." : "",
    p >= S.length ? " (Stepped back: branching from here steps forward first.)" : "");
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
  const p1 = step.probs_t1 || probsAt(step.candidates.map((c) => c.logit), 1);
  const table = h("table", { class: "cand-table" },
    h("thead", null, h("tr", null,
      h("th", { class: "num", text: "#" }),
      h("th", { text: "token" }),
      h("th", { class: "num", title: "the search score: the dot product of the final vector with the token's vector", text: "logit" }),
      probHead("p at T=1", k, { title: `the model's own probabilities: softmax of the logits over these ${k} candidates` }),
      probHead(`p at T=${T.toFixed(2)}`, k, { id: "p-temp-head", title: "recomputed here from the logits as you move the temperature slider" }),
      h("th", { class: "num", text: "cumulative" }),
      h("th", { class: "act", dataset: { label: "" }, text: "" }))),
    h("tbody", null, step.candidates.map((c, i) => candidateRow(c, i, p, p1[i], tok.id))));
  const save = saveButton(() => [tokenEvidence("token", p), [], `The token at position ${p} and the ${k} candidates it was chosen from.`]);
  box.replaceChildren(selHead(tok, p, step), explain(step, tok, p, k), h("div", { class: "actions save-row" }, save),
    h("div", { class: "table-scroll" }, labelled(table)));
  updateProbs();
}

// The temperature slider: recomputed here from the stored logits, no request.
export function updateProbs() {
  const rows = $("candidates").querySelectorAll("tbody tr");
  const step = S.selected === null ? undefined : stepAt(S.selected);
  if (!rows.length || !step) return;
  const T = temperature();
  const pT = probsAt(step.candidates.map((c) => c.logit), T);
  const headCell = $("p-temp-head");
  if (headCell) headCell.textContent = `p at T=${T.toFixed(2)}`;
  let cum = 0;
  rows.forEach((tr, i) => {
    cum += pT[i];
    setProb(tr.querySelector(".p-t"), pT[i]);
    tr.querySelector(".cum").textContent = pct(Math.min(1, cum));
  });
}

export function initCandidates() { view("candidates", renderCandidates); }
