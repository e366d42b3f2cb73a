// The running text: prompt tokens, generated tokens shaded by the probability they
// were chosen with, tokens stepped back from. Spaces and newlines that are whole
// tokens are shown, and so are the bytes of a character split over tokens.
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
const shade = (p) => `hsl(245 85% ${95 - 20 * Math.max(0, Math.min(1, p))}%)`;

function tokenTitle(p, tok, step, ghost) {
  let title = `position ${p} · token id ${tok.id}`;
  if (step) {
    const pc = chosenProb(step, tok.id);
    title += ` · chosen with p = ${pct(pc)} at T = ${step.temperature} · p = ${pct(probOfT1(step, tok.id))} at T = 1 among the ${step.candidates.length} candidates`;
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
    const style = step && !ghost ? { backgroundColor: shade(chosenProb(step, tok.id)) } : {};
    frag.appendChild(h("span", {
      class: classes.join(" "), dataset: { position: String(p), tokenId: String(tok.id) },
      tabindex: "0", role: "button", title: tokenTitle(p, tok, step, ghost), style,
    }, streamToken(tok.text, tok.hex)));
    key = p === 0 ? String(tok.id) : key + "," + tok.id;
  }
  box.replaceChildren(frag);
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
