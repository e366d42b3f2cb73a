// "Look inside" the selected token: the view from the position before it, whose
// output predicted it (position t's output predicts token t+1): its attention and
// the lens, what each part adds (and why this token and not another), switching parts off,
// the MLP's neurons. Asked for on demand (extra searches, counted) or live with generation.
import { api, textPath } from "./api.js";
import { $, h, placeholder, showError, visibleToken } from "./dom.js";
import { plural } from "./format.js";
import { renderAblate } from "./ablate.js";
import { renderAttention } from "./attention.js";
import { renderAttribution } from "./attribution.js";
import { renderLens } from "./lens.js";
import { renderNeurons } from "./neurons.js";
import { renderVersus } from "./versus.js";
import { withText } from "./reopen.js";
import { S, insideKey, keepInside, nLayer, render, view } from "./state.js";

const LENS_K = 10;
let loading = null; // the inside key being fetched

// versus: the token id the attribution is compared with (default: the runner-up); pushing: the
// neurons pushing the token most too (every neuron's row: a search a layer over all of c_proj).
// Exported for the notebook's Reopen, which brings back the view an insight was saved from.
export async function lookInside(p, { versus = null, pushing = false } = {}) {
  const key = insideKey(p);
  loading = key;
  render("inside");
  try {
    const ask = `/steps/${p}/inspect?lens_k=${LENS_K}` + (versus === null ? "" : `&versus=${versus}`) + (pushing ? "&pushing=true" : "");
    const v = await withText(() => api("GET", textPath(S.textId, ask)));
    keepInside(p, v);
  } catch (e) {
    showError(e);
  } finally {
    if (loading === key) loading = null;
    render("inside", "waterfall");
  }
}

function headline(p) {
  const tok = S.tokens[p];
  const prev = S.tokens[p - 1];
  return h("p", { class: "inside-head" },
    "Position ", h("b", { text: String(p - 1) }), " (", visibleToken(prev.text, prev.hex), ")'s output predicts position ",
    h("b", { text: String(p) }), " (", visibleToken(tok.text, tok.hex), "): position t's output predicts token t + 1.");
}

function cost(v) {
  const n = (v.requests || []).length;
  if (v.live) return "Sent with the generation (“look inside while generating”).";
  return `This view cost ${plural(n, "extra request")} (listed in the waterfall below)${v.recomputed ? ", the attention recomputed" : ""}.`;
}

function renderInside() {
  const box = $("inside");
  const p = S.selected;
  if (p === null || !S.textId || p >= S.tokens.length) {
    box.replaceChildren(placeholder("Select a token to look inside the model as it predicted it: attention per layer and head, and the path to the token layer by layer."));
    return;
  }
  if (p === 0) { box.replaceChildren(placeholder("The first token is not predicted by anything: nothing comes before it.")); return; }
  if (p > S.readUpto || p > S.length) {
    box.replaceChildren(placeholder(`The model has not read position ${p - 1} yet (it reads a token when it generates the next one): generate to look inside.`));
    return;
  }
  const v = S.inside.get(insideKey(p));
  const lensSearches = nLayer() + 1;
  const button = h("button", { type: "button", id: "look-inside", disabled: loading !== null || S.generating,
    onclick: () => lookInside(p) }, v && !v.live ? "Look again" : "Look inside this token");
  const kids = [headline(p)];
  if (!v) {
    kids.push(h("p", { class: "note", text: `Costs extra searches: the lens is ${plural(lensSearches, "top-k search", "top-k searches")} over the token vectors (one a layer, sent together where the store allows), what each part adds needs the token's and the runner-up's wte rows (one fetch) and one search a layer (each head's write), the MLP's neurons one search a layer (every neuron's row) and one over wte for the tokens they promote, and a step whose attention is no longer kept is recomputed. Each is counted in the waterfall.` }),
      h("div", { class: "actions" }, button, loading ? h("span", { class: "status", text: "looking inside…" }) : ""));
    box.replaceChildren(...kids);
    return;
  }
  const attn = h("div", { id: "attention", class: "attention" });
  const lens = h("div", { id: "lens", class: "lens" });
  const parts = h("div", { id: "attribution", class: "attribution" });
  const versus = h("div", { id: "versus", class: "attribution versus" });
  const off = h("div", { id: "ablate", class: "ablate" });
  const mlp = h("div", { id: "neurons", class: "neurons-view" });
  kids.push(h("p", { class: "note inside-cost", text: cost(v) }), attn, lens, parts, versus, off, mlp);
  if (v.live && !v.attribution) {
    kids.push(h("p", { class: "note", text: "“Look inside” adds what each part adds to this token, why it and not the runner-up, and the MLP's neurons (more searches, counted)." }),
      h("div", { class: "actions" }, button));
  }
  box.replaceChildren(...kids);
  const openHead = renderAttention(attn, v);
  renderLens(lens, v);
  renderAttribution(parts, v, openHead);
  const busy = loading !== null || S.generating;
  const shown = v.attribution && v.attribution.versus ? v.attribution.versus.token_id : null;
  renderVersus(versus, v, openHead, (id) => lookInside(p, { versus: id, pushing: !!v.pushing }), busy);
  renderAblate(off, p, S.info && S.info.config);
  renderNeurons(mlp, v, () => lookInside(p, { versus: shown, pushing: true }), busy);
}

export function initInside() {
  view("inside", renderInside);
  // With "look inside" on, clicking a token asks for its view at once.
  document.addEventListener("click", (e) => {
    const t = e.target.closest && e.target.closest("#tokens .token");
    if (!t || !$("inspect-live").checked || S.generating) return;
    const p = Number(t.dataset.position);
    if (p > 0 && p <= S.readUpto && p <= S.length && !S.inside.has(insideKey(p)) && loading === null) lookInside(p);
  });
}
