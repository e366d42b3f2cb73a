// What each part adds: the direct logit attribution of the token the view predicts. The
// residual entering ln_f is a sum of parts (the embedding, each head's write, each
// layer's attention bias, each MLP); with ln_f's scale taken from that residual, each
// part's share of the token's logit is ((part - mean) / s * g) . wte[token], and ln_f's
// bias adds b . wte[token]. The server computes them (searches, counted); the parts sum
// to the logit. A sorted bar chart; a head's bar opens that head's attention. Below it, why
// this token and not another: the same parts of the difference of the two logits (versus).
import { h, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { saveButton, tokenEvidence, withData } from "./insight.js";

const SHOWN = 12; // bars drawn before "show all"
const KIND_NAME = { embed: "the embedding", attn: "attention heads", attn_bias: "attention biases", mlp: "MLPs", ln_f_bias: "ln_f's bias" };
export const signed = (x) => (x >= 0 ? "+" : "−") + Math.abs(x).toFixed(3);

// One bar: a diverging scale around zero, so a part that lowers the logit points left.
function bar(part, scale, openHead) {
  const w = (Math.abs(part.value) / scale) * 50;
  const label = part.kind === "attn" && openHead
    ? h("button", { type: "button", class: "part-label part-head", dataset: { layer: String(part.layer), head: String(part.head) },
      title: `open layer ${part.layer} head ${part.head}'s attention`, onclick: () => openHead(part.layer, part.head, true) }, part.label)
    : h("span", { class: "part-label", text: part.label });
  return h("div", { class: `part part-${part.kind} ${part.value >= 0 ? "pos" : "neg"}`, dataset: { kind: part.kind, value: String(part.value) } },
    label,
    h("span", { class: "part-track" }, h("span", { class: "part-zero" }),
      h("span", { class: "part-bar", style: { left: (part.value >= 0 ? 50 : 50 - w).toFixed(2) + "%", width: Math.max(0.4, w).toFixed(2) + "%" } })),
    h("span", { class: "part-value num", text: signed(part.value) }));
}

function byKind(parts) {
  const sums = new Map();
  for (const p of parts) sums.set(p.kind, (sums.get(p.kind) || 0) + p.value);
  return h("p", { class: "note part-kinds" }, [...sums].map(([k, v], i) => [i ? " · " : "", h("b", { text: KIND_NAME[k] || k }), ` ${signed(v)}`]));
}

function topHeads(parts) {
  const heads = parts.filter((p) => p.kind === "attn");
  const up = heads.filter((p) => p.value > 0).slice(0, 3), down = heads.filter((p) => p.value < 0).sort((a, b) => a.value - b.value).slice(0, 2);
  const say = (list) => list.map((p) => `${p.label} (${signed(p.value)})`).join(", ");
  if (!heads.length) return "";
  return h("p", { class: "part-heads", text: (up.length ? `The heads that add most: ${say(up)}. ` : "No head adds to it. ") +
    (down.length ? `Most against: ${say(down)}.` : "") });
}

// A sorted bar chart of parts (largest first), the first SHOWN drawn until "show all":
// -> [chart, its button]
export function partsChart(unsorted, openHead) {
  const parts = [...unsorted].sort((x, y) => Math.abs(y.value) - Math.abs(x.value));
  const scale = Math.max(...parts.map((p) => Math.abs(p.value)), 1e-12);
  const chart = h("div", { class: "parts" });
  let all = false;
  const more = h("button", { type: "button", class: "parts-more" });
  const draw = () => {
    chart.replaceChildren(...(all ? parts : parts.slice(0, SHOWN)).map((p) => bar(p, scale, openHead)));
    more.textContent = all ? `Show the ${SHOWN} largest` : `Show all ${int(parts.length)} parts`;
    more.hidden = parts.length <= SHOWN;
  };
  more.addEventListener("click", () => { all = !all; draw(); });
  draw();
  return [chart, more];
}

// The attribution part of a token's inside view, into `box`; openHead(l, h, reveal)
// opens a head in the attention grid above.
export function renderAttribution(box, view, openHead) {
  const a = view.attribution;
  if (!a || !a.parts || !a.parts.length) { box.replaceChildren(); return; }
  const sum = a.parts.reduce((s, p) => s + p.value, 0);
  const tok = a.token || { text: `#${a.token_id}` };
  box.replaceChildren(
    h("h3", { text: "What each part adds" }),
    h("p", { class: "note" }, "The logit of ", visibleToken(tok.text, tok.bytes_hex), ` (${a.logit.toFixed(3)}) split into what each part of the model wrote into position ${view.query_position}'s residual stream: ` +
      "the embedding, each attention head, each layer's attention bias, each MLP and ln_f's bias. Each part is read through the final layer norm " +
      "with the scale of the actual residual (the standard linearisation), so the parts add up to the logit. Sorted by size; a head's name opens its attention."),
    byKind(a.parts), topHeads([...a.parts].sort((x, y) => Math.abs(y.value) - Math.abs(x.value))), ...partsChart(a.parts, openHead),
    h("p", { class: "note part-sum" }, `The ${plural(a.parts.length, "part")} sum to `, h("b", { class: "sum", text: sum.toFixed(4) }),
      "; the logit is ", h("b", { class: "logit", text: a.logit.toFixed(4) }), "."),
    saveRow(view, a));
}

// The parts as the notebook keeps them (replay recomputes each and names any that differs).
const bare = (parts) => parts.map(({ kind, layer, head, value }) => ({ kind, ...(layer === undefined ? {} : { layer }), ...(head === undefined ? {} : { head }), value }));

// Save the attribution, with the comparison shown below it (versus), as an insight.
function saveRow(view, a) {
  const build = () => {
    const v = a.versus;
    const data = { token_id: a.token_id, logit: a.logit, parts: bare(a.parts),
      ...(v ? { versus: { token_id: v.token_id, logit: v.logit, parts: bare(v.parts) } } : {}) };
    const texts = [[a.token_id, (a.token || {}).text], ...(v ? [[v.token_id, (v.token || {}).text]] : [])].filter(([, t]) => t !== undefined);
    return [withData(tokenEvidence("attribution", view.position, view), data), texts,
      `What each part adds to the token at position ${view.position}` + (v ? `, and why it and not token ${v.token_id}` : "") + ": replay recomputes every part."];
  };
  return h("div", { class: "actions save-row" }, saveButton(build, "Save these parts as insight"));
}
