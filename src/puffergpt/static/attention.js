// Attention as the search it is: for the query of position p-1, the weights over
// every earlier position, for every layer and head (a grid of strips), and one head
// opened: the keys its search returned, best first, and on demand what it writes (its values
// through its rows of c_proj, a piece a source position, read as tokens).
import { api, textPath } from "./api.js";
import { clearAt, errorAt, failAt, h, labelled, visibleToken } from "./dom.js";
import { int, pct } from "./format.js";
import { saveButton, tokenEvidence, withData } from "./insight.js";
import { withText } from "./reopen.js";
import { S, insideKey, render } from "./state.js";

// One colour scale for every strip, the opened head and the legend: linear in the
// weight, white at 0 to the accent colour at 100% (the same weight, the same colour).
const INK = [79, 70, 229];
export const weightColour = (w) => {
  const a = Math.max(0, Math.min(1, w));
  return INK.map((c) => Math.round(255 - a * (255 - c)));
};

// A strip of p cells, darker where the head puts more weight: one pixel a position,
// stretched by CSS (image-rendering: pixelated keeps the cells sharp).
export function strip(weights) {
  const c = document.createElement("canvas");
  c.width = Math.max(1, weights.length);
  c.height = 1;
  const ctx = c.getContext("2d");
  const img = ctx.createImageData(c.width, 1);
  weights.forEach((w, i) => img.data.set([...weightColour(w), 255], i * 4));
  ctx.putImageData(img, 0, 0);
  c.className = "strip";
  return c;
}

const tokenAt = (view, j) => (view.tokens && view.tokens[j]) || (S.tokens[j] ? { text: S.tokens[j].text, token_id: S.tokens[j].id, bytes_hex: S.tokens[j].hex } : { text: "?", token_id: "?" });
const argmax = (a) => a.reduce((b, x, i) => (x > a[b] ? i : b), 0);

// A head's strip, labelled in words: the token it puts most weight on, and how much.
function cell(view, l, hd, open) {
  const w = view.attention[l][hd];
  const j = argmax(w);
  const tok = tokenAt(view, j);
  const says = `layer ${l}, head ${hd}: most weight on position ${j} (${JSON.stringify(tok.text)}), ${pct(w[j])}`;
  return h("button", {
    type: "button", class: "attn-cell", dataset: { layer: String(l), head: String(hd), top: String(j) },
    title: says, "aria-label": `open ${says}`, onclick: () => open(l, hd, true),
  }, strip(w), h("span", { class: "attn-word" }, visibleToken(tok.text, tok.bytes_hex)), weightShown(w[j]));
}

// The weight under a strip: as pct() writes it, and in whole percent for a phone's narrow
// cells (style.css shows one or the other; the title keeps the exact share).
export function weightShown(w) {
  return h("span", { class: "attn-pct" }, h("span", { class: "pct-full", text: pct(w) }),
    h("span", { class: "pct-short", text: w > 0 && w < 0.005 ? "<1%" : `${Math.round(w * 100)}%` }));
}

// The colour scale, once for the grid and the opened head.
function legend() {
  return h("div", { class: "attn-legend", "aria-label": "colour scale: weight from 0% to 100%" },
    h("span", { class: "attn-legend-scale" }, h("span", { class: "attn-legend-bar" }),
      h("span", { class: "attn-legend-ticks" }, ["0%", "25%", "50%", "75%", "100%"].map((t) => h("span", { text: t })))),
    h("span", { class: "attn-legend-note", text: "weight on a position, on a linear scale: the same colour is the same share in every strip" }));
}

function grid(view, open) {
  const L = view.attention.length, H = view.attention[0].length;
  const g = h("div", { class: "attn-grid", style: { gridTemplateColumns: `auto repeat(${H}, minmax(0, 1fr))` } },
    h("span", { class: "attn-corner", title: "rows: layers; columns: heads", text: "l\\h" }),
    Array.from({ length: H }, (_, hd) => h("span", { class: "attn-col", text: String(hd) })));
  for (let l = 0; l < L; l++) {
    g.appendChild(h("span", { class: "attn-row", text: String(l) }));
    for (let hd = 0; hd < H; hd++) g.appendChild(cell(view, l, hd, open));
  }
  return g;
}

const SHOWN = 16; // keys listed in the opened head; the rest are summed

// What the store searched for a query at position q: the keys before it (the filter is
// position < q); its own key, written in the same step, is scored here (q·k) without a search.
function searchedNote(q) {
  const own = `its own key at position ${q} is scored here, q·k, without a search`;
  if (q === 0) return `Position 0 has no earlier keys: no search, ${own}. `;
  return `The query searched this head's keys in the store at positions 0 to ${q - 1} (the filter is position < ${q}: a later key can't match); ${own}. `;
}

const headDim = () => (S.info ? S.info.config.n_embd / S.info.config.n_head : 64);
const signed = (x) => (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(3);
const WRITES_SHOWN = 8; // source positions listed in "what it writes"; the rest are summed
let writing = null; // "inside key|L.H" being fetched

async function askWrites(view, l, hd, reopen) {
  const key = insideKey(view.position) + "|" + l + "." + hd;
  writing = key;
  reopen();
  try {
    const got = await withText(() => api("POST", textPath(S.textId, `/steps/${view.position}/writes`), { head: `${l}.${hd}` }));
    view.writes = { ...(view.writes || {}), [`${l}.${hd}`]: got };
    view.requests = [...(view.requests || []), ...got.requests]; // in the waterfall with the view's extra searches
    clearAt("writes|" + key);
  } catch (e) {
    failAt("writes|" + key, e);
  } finally {
    if (writing === key) writing = null;
    reopen();
    render("waterfall");
  }
}

// The head's bar in "What each part adds", where the view has the attribution.
function headBar(view, l, hd) {
  const parts = view.attribution ? view.attribution.parts : [];
  const bar = parts.find((x) => x.kind === "attn" && x.layer === l && x.head === hd);
  return bar ? bar.value : null;
}

function writesTable(got) {
  const order = got.sources.map((_, i) => i).sort((a, b) => Math.abs(got.sources[b].effect) - Math.abs(got.sources[a].effect));
  const rows = order.slice(0, WRITES_SHOWN).map((i) => {
    const s = got.sources[i];
    return h("tr", { dataset: { position: String(s.position), effect: String(s.effect) } },
      h("td", { class: "num", text: String(s.position) }),
      h("td", { class: "tok" }, visibleToken(s.token.text, s.token.bytes_hex)),
      h("td", { class: "num prob" }, h("span", { class: "pbar", style: { width: (s.weight * 100).toFixed(1) + "%" } }), h("span", { class: "pval", text: pct(s.weight) })),
      h("td", { class: "num effect " + (s.effect >= 0 ? "pos" : "neg"), text: signed(s.effect) }),
      h("td", { class: "writes-top" }, s.top.map((t, k) => h("span", { class: "writes-tok" + (t.token_id === got.token_id ? " is-chosen" : ""), dataset: { tokenId: String(t.token_id), rank: String(k) } }, visibleToken(t.text, t.bytes_hex)))));
  });
  const rest = order.slice(WRITES_SHOWN).reduce((a, i) => a + got.sources[i].effect, 0);
  return [h("div", { class: "table-scroll" }, labelled(h("table", { class: "writes-table" },
    h("thead", null, h("tr", null, h("th", { class: "num", text: "position" }), h("th", { text: "token" }),
      h("th", { class: "num", text: "weight" }), h("th", { class: "num", text: "effect" }), h("th", { text: "pushes most" }))),
    h("tbody", null, rows)))),
  order.length > WRITES_SHOWN ? h("p", { class: "note", text: `The other ${int(order.length - WRITES_SHOWN)} positions add ${signed(rest)} together.` }) : ""];
}

// What the opened head writes for the selected token: asked on demand (searches, counted).
function writesSection(view, l, hd, reopen) {
  if (!view.position || !S.textId) return "";
  const key = insideKey(view.position) + "|" + l + "." + hd;
  const got = view.writes && view.writes[`${l}.${hd}`];
  const kids = [h("h4", { text: "What it writes" })];
  if (!got) {
    kids.push(h("p", { class: "note", text: "The head mixes the value vectors of the positions it attends to, with these weights, and its rows of c_proj turn the mix into what it adds to the residual. " +
      "Split by position: each piece is weight × value × the head's rows of c_proj, read as the tokens it pushes. Costs 3 extra searches (c_proj, the token's vector, a top-k over the token vectors), counted." }),
    h("div", { class: "actions" }, h("button", { type: "button", class: "writes-go", disabled: writing !== null || S.generating,
      onclick: () => askWrites(view, l, hd, reopen) }, "What it writes"), writing === key ? h("span", { class: "status", text: "asking…" }) : ""),
    errorAt("writes|" + key));
    return h("div", { class: "attn-writes" }, kids);
  }
  const bar = headBar(view, l, hd);
  kids.push(h("p", { class: "note writes-says" },
    `For the token at position ${view.position}, `, visibleToken(got.token.text, got.token.bytes_hex),
    `: each row is position j's piece a_j · v_j · W_O (its attention weight, the value vector the head read there, the head's ${headDim()} rows of c_proj). ` +
    "Effect: the piece's share of the token's logit, read through ln_f as “What each part adds” reads a part. Pushes most: the 5 tokens whose vectors score highest against the piece, a search over every token vector. ",
    h("b", { class: "writes-total", dataset: { total: String(got.total) }, text: `The pieces sum to ${signed(got.total)}` }),
    bar === null ? "." : `: this head's bar in “What each part adds” (L${l} H${hd}: ${signed(bar)}).`),
  ...writesTable(got));
  return h("div", { class: "attn-writes" }, kids);
}

// One head opened: the keys its search returned, best first, and the text shaded.
function headDetail(view, l, hd, reopen) {
  const w = view.attention[l][hd];
  const scores = view.scores ? view.scores[l][hd] : null;
  // Best first by score, where the view has them: the weights come rounded to 6 decimals,
  // and the many that round alike would otherwise keep their positions' order.
  const order = w.map((_, j) => j).sort((a, b) => (scores ? scores[b] - scores[a] : 0) || w[b] - w[a] || a - b);
  const rows = order.slice(0, SHOWN).map((j, i) => {
    const tok = tokenAt(view, j);
    return h("tr", { dataset: { position: String(j) } },
      h("td", { class: "num", text: String(i + 1) }),
      h("td", { class: "num", text: String(j) }),
      h("td", { class: "tok" }, visibleToken(tok.text, tok.bytes_hex)),
      h("td", { class: "num", text: scores ? scores[j].toFixed(3) : "–" }),
      h("td", { class: "num prob" }, h("span", { class: "pbar", style: { width: (w[j] * 100).toFixed(1) + "%" } }), h("span", { class: "pval", text: pct(w[j]) })));
  });
  const rest = order.slice(SHOWN).reduce((a, j) => a + w[j], 0);
  const text = h("div", { class: "attn-text" }, w.map((x, j) => h("span", {
    class: "attn-tok" + (j === view.query_position ? " query" : ""), title: `position ${j}: ${pct(x)}`,
    style: { backgroundColor: `rgb(${weightColour(x).join(", ")})`, color: x > 0.55 ? "#fff" : null },
  }, visibleToken(tokenAt(view, j).text, tokenAt(view, j).bytes_hex))));
  return h("div", { class: "attn-head", dataset: { layer: String(l), head: String(hd) } },
    h("h4", { text: `Layer ${l}, head ${hd}: the search of position ${view.query_position}'s query` }),
    h("p", { class: "note", text: searchedNote(view.query_position) +
      `score = q·k / √d: the search returned q·k and the server divided it by √d (d = ${headDim()}, the head's size); weight = softmax of the scores.` + (scores ? "" : " (Scores come with “Look inside”; a live view carries the weights only.)") }),
    text,
    h("div", { class: "table-scroll" }, labelled(h("table", { class: "attn-table" },
      h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { class: "num", text: "position" }), h("th", { text: "token" }),
        h("th", { class: "num", text: "score" }), h("th", { class: "num", text: "weight" }))),
      h("tbody", null, rows)))),
    rest > 0 ? h("p", { class: "note", text: `The other ${int(order.length - SHOWN)} keys share the remaining ${pct(rest)}.` }) : "",
    writesSection(view, l, hd, reopen),
    h("div", { class: "actions save-row" }, saveButton(() => [
      withData(tokenEvidence("attention", view.position, view), { layer: l, head: hd, weights: w }), [],
      `Layer ${l}, head ${hd}: where the query of position ${view.query_position} put its weight, with the token it helped predict.`,
    ], "Save this head as insight")));
}

// The attention part of a token's inside view, into `box`.
export function renderAttention(box, view) {
  if (!view.attention || !view.attention.length) { box.replaceChildren(); return; }
  const L = view.attention.length, H = view.attention[0].length;
  const detail = h("div", { class: "attn-detail" });
  // Open a head; `reveal` (a tap or a click from elsewhere) scrolls it into view, as the
  // detail may be below the screen on a phone.
  const open = (l, hd, reveal = false) => {
    box.querySelectorAll(".attn-cell.open").forEach((b) => b.classList.remove("open"));
    const b = box.querySelector(`.attn-cell[data-layer="${l}"][data-head="${hd}"]`);
    if (b) b.classList.add("open");
    view.openHead = [l, hd]; // kept with the view: re-rendering keeps it open
    detail.replaceChildren(headDetail(view, l, hd, () => open(l, hd)));
    if (reveal) detail.scrollIntoView({ block: "nearest" });
  };
  const src = view.recomputed
    ? "recomputed for this view: its requests are listed as extra searches in the waterfall"
    : `the softmax of the scores that this step's own ${int(L)} attention searches (h.*.attn.scores, ${int(H)} heads each) returned: no extra search`;
  box.replaceChildren(
    h("h3", { text: "Attention" }),
    h("p", { class: "note", text: `Each strip is one head: where the query of position ${view.query_position} put its weight over positions 0 to ${view.query_position} (left to right, darker = more), ` +
      `with the token it puts most weight on written under it. The weights are ${src}. Tap or click a strip to open the head.` }),
    legend(), grid(view, open), detail);
  if (view.openHead) open(...view.openHead);
  return open;
}
