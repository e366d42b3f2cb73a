// The logit lens as search: entering each block, the residual stream (ln_f applied)
// searched against the token vectors. Layer 0 is the embedding, the last row the
// final candidates. The chosen token's rank per layer, and where it first wins.
import { h, labelled, visibleToken } from "./dom.js";
import { plural } from "./format.js";
import { saveButton, tokenEvidence, withData } from "./insight.js";
import { S } from "./state.js";

// Live views carry a list of top-k lists; inspect views carry {layer, top, chosen_rank}.
export function normLens(lens, chosenId) {
  return lens.map((e, l) => {
    const top = Array.isArray(e) ? e : e.top;
    const rank = Array.isArray(e) || e.chosen_rank === undefined
      ? (() => { const i = top.findIndex((t) => t.token_id === chosenId); return i < 0 ? null : i; })()
      : e.chosen_rank;
    return { layer: Array.isArray(e) ? l : e.layer, top, chosen_rank: rank };
  });
}

function tokenText(t) {
  if (t.text !== undefined) return t;
  const known = S.tokens.find((x) => x.id === t.token_id);
  return { ...t, text: known ? known.text : `#${t.token_id}` };
}

// The decided layer, as the server defines it (inside.decided_layer) and /how says: the
// smallest layer from which the lens's top-1 is the final top-1 at every later layer. The
// server sends it; this is for a view that lacks it.
export function decidedLayer(rows) {
  const final = rows[rows.length - 1].top[0].token_id;
  let i = rows.length - 1;
  while (i > 0 && rows[i - 1].top.length && rows[i - 1].top[0].token_id === final) i--;
  return rows[i].layer;
}

const layerName = (l, L) => (l === 0 ? "0 · embedding" : l === L ? `${l} · final` : `${l} · entering block ${l}`);

function chip(t, i, chosenId) {
  const tok = tokenText(t);
  return h("span", { class: "lens-chip" + (t.token_id === chosenId ? " chosen" : ""),
    title: `rank ${i + 1} · token id ${t.token_id} · logit ${t.logit.toFixed(3)}` }, visibleToken(tok.text, tok.bytes_hex));
}

export function renderLens(box, view) {
  if (!view.lens || !view.lens.length) { box.replaceChildren(); return; }
  const predicted = view.predicts_token || (S.tokens[view.position] ? { token_id: S.tokens[view.position].id, text: S.tokens[view.position].text } : null);
  const chosenId = predicted ? predicted.token_id : null;
  const rows = normLens(view.lens, chosenId);
  const L = rows.length - 1;
  const first = Number.isInteger(view.decided_layer) ? view.decided_layer : decidedLayer(rows);
  const finalTop = tokenText(view.final_top1 || rows[L].top[0]);
  const k = rows[0].top.length;
  const table = h("table", { class: "lens-table" },
    h("thead", null, h("tr", null, h("th", { text: "layer" }),
      h("th", { class: "num", text: predicted ? "rank of the chosen" : "rank" }), h("th", { text: `top ${k}, best first` }))),
    h("tbody", null, rows.map((r) => h("tr", { class: r.layer === first ? "decided" : r.layer > first ? "after-decided" : null, dataset: { layer: String(r.layer) } },
      h("td", { class: "layer", text: layerName(r.layer, L) }),
      h("td", { class: "num rank", text: r.chosen_rank === null ? `not in top ${k}` : String(r.chosen_rank + 1) }),
      h("td", { class: "chips" }, r.top.map((t, i) => chip(t, i, chosenId)))))));
  const nSearch = rows.length;
  box.replaceChildren(
    h("h3", { text: "The path to the next token (the lens)" }),
    h("p", { class: "note" },
      `Entering each block, the vector of position ${view.query_position} is normalised (ln_f) and searched against the token vectors: `,
      `${plural(nSearch, "top-k search", "top-k searches")}, one a row (the last row is the model's own final search), counted with this view's requests in the waterfall. `,
      first === L
        ? h("span", { class: "decided-note" }, `The decided layer is layer ${first}, the last: no earlier layer's top-1 stays the final top-1, `,
          visibleToken(finalTop.text, finalTop.bytes_hex), ", to the end, so only the final search settles it. ")
        : h("span", { class: "decided-note" }, `The decided layer is layer ${first} (highlighted): from it to the last row, every layer's top-1 is the final top-1, `,
          visibleToken(finalTop.text, finalTop.bytes_hex), ". That is where the model made up its mind. "),
      predicted && finalTop.token_id !== predicted.token_id
        ? ["The token chosen here, ", visibleToken(predicted.text, predicted.bytes_hex), ", is not the final top-1: sampling took another candidate. The rank column follows it."]
        : predicted ? ["The rank column follows the token chosen here, ", visibleToken(predicted.text, predicted.bytes_hex), "."] : "The token at this position is not chosen yet."),
    h("div", { class: "table-scroll" }, labelled(table)),
    saveRow(view, rows, Number.isInteger(view.lensLayer) ? view.lensLayer : first));
}

// Save one layer of the lens (by default where the model made up its mind; a reopened
// insight's layer where the view has one).
function saveRow(view, rows, layer) {
  const L = rows.length - 1;
  const pick = h("select", { class: "lens-layer", "aria-label": "the lens layer to save" },
    rows.map((r) => h("option", { value: String(r.layer), selected: r.layer === layer, text: `layer ${layerName(r.layer, L)}` })));
  const build = () => {
    const r = rows[Number(pick.value)];
    const data = { layer: r.layer, ids: r.top.map((t) => t.token_id), logits: r.top.map((t) => t.logit) };
    const texts = r.top.filter((t) => t.text !== undefined).map((t) => [t.token_id, t.text]);
    return [withData(tokenEvidence("lens", view.position, view), data), texts,
      `The lens at layer ${r.layer} for the token at position ${view.position}: what the model would say if it stopped there.`];
  };
  return h("div", { class: "actions save-row" }, h("label", null, "Lens at ", pick), saveButton(build, "Save this layer as insight"));
}
