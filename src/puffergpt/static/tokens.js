// The running text: prompt tokens, generated tokens shaded by how probable they were, tokens
// stepped back from. The shade is the model's own probability of the token over the whole
// vocabulary at T = 1 (p_all) where the step knows it (its candidates opened), else the
// sampler's probability, renormalised over the top k at the step's T; each token's title says
// which. Spaces and newlines that are whole tokens are shown, and so are the bytes of a
// character split over tokens.
import { $, h, streamToken } from "./dom.js";
import { pct } from "./format.js";
import { S, select, view } from "./state.js";

export function chosenProb(step, id) {
  const c = step.candidates.find((x) => x.token_id === id);
  return c ? c.prob : 0;
}
function probOfT1(step, id) {
  const i = step.candidates.findIndex((x) => x.token_id === id);
  return i >= 0 && step.probs_t1 ? step.probs_t1[i] : 0;
}
// What a generated token is shaded by: {p, by, model} (model: p is the model's own, over all tokens).
export function shadeOf(step, id) {
  const c = step.candidates.find((x) => x.token_id === id);
  if (c && typeof c.p_all === "number") return { p: c.p_all, model: true, by: "the model's probability over all tokens at T = 1" };
  return { p: c ? c.prob : 0, model: false, by: `the sampler's probability at T = ${step.temperature}, over the top ${step.candidates.length}` };
}
const shade = (p) => `hsl(245 85% ${95 - 20 * Math.max(0, Math.min(1, p))}%)`;

function tokenTitle(p, tok, step, ghost) {
  let title = `position ${p} · token id ${tok.id}`;
  if (step) {
    const pc = chosenProb(step, tok.id), s = shadeOf(step, tok.id);
    title += ` · chosen with p = ${pct(pc)} at T = ${step.temperature} · p = ${pct(probOfT1(step, tok.id))} at T = 1 among the ${step.candidates.length} candidates`;
    title += s.model ? ` · the model's own p = ${pct(s.p)} over all tokens at T = 1 (the shade)` : " · shaded by the sampler's p (open its candidates for the model's own over all tokens)";
  } else if (!ghost) {
    title += " · prompt token";
  }
  return ghost ? title + " · stepped back: Forward brings it back" : title;
}

function renderTokens() {
  const box = $("tokens");
  box.dataset.textId = S.textId || ""; // which text this is (the tests ask the API about it)
  if (!S.tokens.length) {
    box.replaceChildren(h("span", { class: "placeholder", text: "Tokens appear here as the model writes them." }));
    return;
  }
  const frag = document.createDocumentFragment();
  let key = "";
  for (let p = 0; p < S.tokens.length; p++) {
    const tok = S.tokens[p];
    const step = p > 0 ? S.memo.get(key) : undefined;
    const ghost = p >= S.length;
    const classes = ["token", ghost ? "ghost" : step ? "generated" : "prompt"];
    if (S.selected === p) classes.push("selected");
    if (S.chosen.get(key) === tok.id) classes.push("branched");
    if (tok.text === "<|endoftext|>") classes.push("eot");
    const s = step && !ghost ? shadeOf(step, tok.id) : null;
    const style = s ? { backgroundColor: shade(s.p) } : {};
    frag.appendChild(h("span", {
      class: classes.join(" "), dataset: { position: String(p), tokenId: String(tok.id), ...(s ? { shade: s.model ? "p_all" : "sampler" } : {}) },
      tabindex: "0", role: "button", title: tokenTitle(p, tok, step, ghost), style,
    }, streamToken(tok.text, tok.hex)));
    key = p === 0 ? String(tok.id) : key + "," + tok.id;
  }
  const focused = box.contains(document.activeElement) ? document.activeElement.dataset.position : undefined;
  box.replaceChildren(frag);
  if (focused !== undefined) { const el = box.querySelector(`.token[data-position="${focused}"]`); if (el) el.focus({ preventScroll: true }); }
}

// A tap on a token answers where it can be seen: on a phone (one column) the selected
// token's panel is far below the text, so it is scrolled into view; on a wide screen it
// is beside the text and nothing moves.
function reveal() {
  const card = $("candidates").closest("section");
  const r = card.getBoundingClientRect();
  const beside = window.matchMedia("(min-width: 1101px)").matches; // style.css: two columns
  const seen = beside ? r.top < window.innerHeight && r.bottom > 0 : r.top >= 0 && r.top < window.innerHeight * 0.6;
  if (!seen) card.scrollIntoView({ block: "start", behavior: "smooth" });
}

export function initTokens() {
  view("tokens", renderTokens);
  const tokens = $("tokens");
  const pick = (e) => {
    const el = e.target.closest(".token");
    if (!el) return;
    select(Number(el.dataset.position));
    reveal();
  };
  tokens.addEventListener("click", pick);
  tokens.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(e); }
    if ((e.key === "ArrowRight" || e.key === "ArrowLeft") && S.selected !== null) {
      const p = S.selected + (e.key === "ArrowRight" ? 1 : -1);
      if (p >= 0 && p < S.tokens.length) {
        e.preventDefault();
        select(p);
        const el = document.querySelector(`#tokens .token[data-position="${p}"]`);
        if (el) el.focus();
      }
    }
  });
}
