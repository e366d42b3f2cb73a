// Context changes meaning: one word in two or three prompts, layer by layer (POST
// /api/contexts, contexts.py), and a control: the word in the sense it has in prompt 1, whose
// line (1·C) is the baseline the other pairs are read against. Per layer, the cosine between
// the word's vectors in the contexts (a chart and a table), each context's logit lens there,
// and each context's attention from the word, head by head, side by side; the server's reading
// of the lines in words, the word's training count (rare marked as the neighbours view marks
// it), and why the lens rows say little where they do. Everything shown as text.
import { api } from "./api.js";
import { $, h, labelled, placeholder, streamToken, svg, visibleToken } from "./dom.js";
import { int, pct, plural } from "./format.js";
import { strip, weightColour, weightShown } from "./attention.js";
import { rareMark } from "./embedding.js";

// Used until the server names its own (/api/info's context_starters, per model): GPT-2's.
const STARTERS = [
  { kind: "mole", word: " mole", prompts: ["American shrew mole", "One mole of carbon dioxide", "Take a biopsy of the mole"], control: "The eastern mole" },
  { kind: "bank", word: " bank", prompts: ["They sat by the river on the grassy bank", "She put the money she earned in the bank"], control: "The boat drifted toward the muddy bank" },
];
const MAX = 3;
const LINES = ["#4f46e5", "#0d9488", "#d97706"]; // a pair's line: solid, dashed, dotted as well as coloured
const DASH = [null, "6 3", "2 3"];
const CONTROL = { colour: "#374151", dash: "9 3 2 3", label: "1·C" }; // the control pair: grey, dash-dot
const FONT = 11; // the chart's text, in CSS pixels: the chart is drawn at the width it is shown
const LABEL_GAP = FONT + 3; // line labels at least this far apart, vertically
const pairsOf = (n) => { const out = []; for (let a = 0; a < n; a++) for (let b = a + 1; b < n; b++) out.push([a, b]); return out; };
const layerName = (l, L) => (l === 0 ? "0 · embedding" : l === L ? `${l} · entering ln_f (final)` : `${l} · entering block ${l}`);
const argmax = (a) => a.reduce((b, x, i) => (x > a[b] ? i : b), 0);

function failed(box, e) {
  box.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message }));
}

// Each prompt as GPT-2 read it: its tokens up to the word (read), the word marked, and the
// tokens after it greyed (never read for this view: GPT-2 reads left to right).
// The control (i null) is numbered C, in the control's grey.
function contextLine(c, i, word) {
  const control = i === null;
  return h("li", { class: control ? "ctx-control-context" : "ctx-context", dataset: { context: control ? "control" : String(i) } },
    h("span", { class: "ctx-num", style: { borderColor: control ? CONTROL.colour : LINES[i] }, text: control ? "C" : String(i + 1),
      title: control ? "the control: the word in the sense it has in context 1" : `context ${i + 1}` }),
    h("span", { class: "ctx-text" }, c.tokens.map((t, j) => h("span", {
      class: "ctx-tok" + (j === c.position ? " ctx-word" : j > c.position ? " ctx-after" : ""), dataset: { position: String(j) },
      title: j === c.position ? `position ${j}: ${JSON.stringify(word.text)}, the vector compared`
        : j > c.position ? `position ${j}: after the word, not read (it can't change the word's vector)` : `position ${j}`,
    }, streamToken(t.text, t.bytes_hex)))));
}

// The chart's lines: one a pair of contexts, and the control pair's, each with its label.
function lines(r) {
  const pairs = pairsOf(r.contexts.length);
  const out = pairs.map(([a, b], i) => ({ key: `${a}-${b}`, label: `${a + 1}·${b + 1}`, colour: LINES[i], dash: DASH[i],
    at: (e) => e.cosine[a][b], says: `contexts ${a + 1} and ${b + 1}` }));
  if (r.control) out.push({ key: "control", label: CONTROL.label, colour: CONTROL.colour, dash: CONTROL.dash, control: true,
    at: (e) => e.control, says: "context 1 and the control (the same sense)" });
  return out;
}

// Labels at the lines' ends, at least LABEL_GAP apart, kept inside the chart: {key: y}.
function endLabels(ls, y, L, r, top, bottom) {
  const ends = ls.map((ln) => ({ key: ln.key, y: y(ln.at(r.layers[L])) + FONT / 3 })).sort((p, q) => p.y - q.y);
  ends.forEach((e, k) => { if (k) e.y = Math.max(e.y, ends[k - 1].y + LABEL_GAP); });
  const over = Math.max(0, ends.length ? ends[ends.length - 1].y - bottom : 0);
  ends.forEach((e) => { e.y = Math.max(top + FONT, e.y - over); });
  ends.forEach((e, k) => { if (k) e.y = Math.max(e.y, ends[k - 1].y + LABEL_GAP); });
  return Object.fromEntries(ends.map((e) => [e.key, e.y]));
}

// The layer numbers along the bottom: every one where they fit, else every other (ln_f always).
function layerTicks(r, x, L, y0) {
  const room = (x(1) - x(0)) || 1, every = Math.max(1, Math.ceil((FONT * 2.2) / room));
  return r.layers.filter((e) => e.layer === L || (e.layer % every === 0 && L - e.layer >= every)).map((e) =>
    svg("text", { class: "ctx-tick", x: x(e.layer).toFixed(1), y: y0, "text-anchor": "middle", text: e.layer === L ? "ln_f" : String(e.layer) }));
}

// The cosine of each pair of contexts, layer by layer: one line a pair, from the embedding
// (layer 0) to the residual entering ln_f, and the control pair's. Drawn at the pixel width it
// is shown at (W), so its text is FONT px on a phone as on a wide screen.
function chart(r, width) {
  const W = Math.round(Math.max(280, Math.min(560, width || 360))), H = 230;
  const PAD = { l: 42, r: 40, t: 14, b: 40 };
  const L = r.layers.length - 1, ls = lines(r);
  const all = r.layers.flatMap((e) => ls.map((ln) => ln.at(e)));
  const lo = Math.max(-1, Math.min(0.9, Math.floor(Math.min(...all) * 10) / 10)), hi = 1;
  const step = hi - lo <= 0.6 ? 0.1 : hi - lo <= 1.2 ? 0.2 : 0.5; // ticks on round numbers
  const x = (l) => PAD.l + (l / Math.max(L, 1)) * (W - PAD.l - PAD.r);
  const y = (v) => PAD.t + (hi - v) / (hi - lo) * (H - PAD.t - PAD.b);
  const kids = [];
  for (let k = 0; k <= Math.round((hi - lo) / step); k++) {
    const v = hi - k * step;
    kids.push(svg("line", { class: "ctx-grid", x1: PAD.l, x2: W - PAD.r, y1: y(v).toFixed(1), y2: y(v).toFixed(1) }),
      svg("text", { class: "ctx-tick", x: PAD.l - 5, y: (y(v) + FONT / 3).toFixed(1), "text-anchor": "end", text: v.toFixed(1) }));
  }
  kids.push(...layerTicks(r, x, L, H - PAD.b + FONT + 5));
  kids.push(svg("text", { class: "ctx-axis", x: ((PAD.l + W - PAD.r) / 2).toFixed(1), y: H - 5, "text-anchor": "middle", text: "layer (last: entering ln_f)" }));
  const labelY = endLabels(ls, y, L, r, PAD.t, H - PAD.b);
  ls.forEach((ln) => {
    const pts = r.layers.map((e) => `${x(e.layer).toFixed(1)},${y(ln.at(e)).toFixed(1)}`).join(" ");
    kids.push(svg("g", { class: "ctx-line" + (ln.control ? " ctx-control-line" : ""), dataset: { pair: ln.key } },
      svg("polyline", { points: pts, stroke: ln.colour, "stroke-dasharray": ln.dash }),
      r.layers.map((e) => svg("circle", { cx: x(e.layer).toFixed(1), cy: y(ln.at(e)).toFixed(1), r: 2.5, fill: ln.colour },
        svg("title", { text: `${ln.says}, layer ${e.layer}: cosine ${ln.at(e).toFixed(4)}` }))),
      svg("text", { class: "ctx-pair", x: (x(L) + 6).toFixed(1), y: labelY[ln.key].toFixed(1), fill: ln.colour, text: ln.label })));
  });
  return svg("svg", { class: "ctx-chart", width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": "the cosine between the contexts' vectors of the word, layer by layer, and the control pair's" }, kids);
}

// What each line is, under the chart: a swatch a line, the control's named as the baseline.
function legend(r) {
  return h("ul", { class: "ctx-legend" }, lines(r).map((ln) => h("li", { dataset: { pair: ln.key } },
    h("span", { class: "ctx-swatch", style: { borderColor: ln.colour, borderStyle: ln.control ? "dashed" : ["solid", "dashed", "dotted"][LINES.indexOf(ln.colour)] } }),
    h("b", { text: ln.label }), ln.control ? ": the control, context 1 and a sentence where the word has the same sense (the baseline)" : `: ${ln.says}`)));
}

// The chart in words: how alike the pairs are at the embedding and entering ln_f.
function summary(r) {
  const pairs = pairsOf(r.contexts.length), L = r.layers.length - 1;
  const span = (l) => {
    const v = pairs.map(([a, b]) => r.layers[l].cosine[a][b]);
    const lo = Math.min(...v).toFixed(4), hi = Math.max(...v).toFixed(4);
    return lo === hi ? lo : `${lo} to ${hi}`;
  };
  const control = r.control ? ` The control (${CONTROL.label}, the same sense): ${r.layers[0].control.toFixed(4)} at the embedding, ${r.layers[L].control.toFixed(4)} entering ln_f.` : "";
  return h("p", { class: "note ctx-summary", text: `Cosine ${span(0)} at the embedding, ${span(L)} entering ln_f` +
    (pairs.length > 1 ? " (over the pairs)." : ".") + control });
}

function cosineTable(r) {
  const ls = lines(r), L = r.layers.length - 1;
  return h("div", { class: "table-scroll" }, labelled(h("table", { class: "ctx-cos-table" },
    h("thead", null, h("tr", null, h("th", { text: "layer" }),
      ls.map((ln) => h("th", { class: "num", dataset: { label: `cosine ${ln.label}` } },
        h("span", { class: "ctx-swatch", style: { borderColor: ln.colour, borderStyle: ln.control ? "dashed" : ["solid", "dashed", "dotted"][LINES.indexOf(ln.colour)] } }),
        ln.control ? `${ln.label} control` : ln.label)))),
    h("tbody", null, r.layers.map((e) => h("tr", { dataset: { layer: String(e.layer) } },
      h("td", { class: "layer", text: layerName(e.layer, L) }),
      ls.map((ln) => h("td", { class: "num " + (ln.control ? "ctx-control" : "ctx-cos"), dataset: { pair: ln.key }, text: ln.at(e).toFixed(4) }))))))));
}

// The server's reading of the lines, from their numbers (contexts.reading), and the word's count.
function reading(r) {
  return h("ul", { class: "ctx-reading" }, r.reading.map((line) => h("li", { text: line })));
}

function rarityNote(r) {
  const x = r.rarity;
  if (!x.counts_known) return h("p", { class: "note rare-note", text: x.note + "." });
  // A word seen often says so in its line (its count); a rare one is marked there and warned of here.
  return x.rare ? h("p", { class: "emb-warning rare-note", role: "status", text: `Rows seen fewer than ${x.rare_below} times in training are marked: ${x.note}.` }) : "";
}

// Each context's lens: what the word's vector would predict if the model stopped at that layer.
function lensTable(r) {
  const L = r.layers.length - 1;
  return h("div", { class: "table-scroll" }, labelled(h("table", { class: "lens-table ctx-lens-table" },
    h("thead", null, h("tr", null, h("th", { text: "layer" }), r.contexts.map((_, i) => h("th", { text: `context ${i + 1}, top ${r.k}` })))),
    h("tbody", null, r.layers.map((e) => h("tr", { dataset: { layer: String(e.layer) } },
      h("td", { class: "layer", text: layerName(e.layer, L) }),
      e.top.map((top, i) => h("td", { class: "ctx-lens", dataset: { context: String(i) } }, h("span", { class: "ctx-chips" },
        top.map((t, j) => h("span", { class: "lens-chip" + (j === 0 ? " ctx-top1" : "") + (t.rare ? " rare" : ""), dataset: { tokenId: String(t.token_id) },
          title: `rank ${j + 1} · token id ${t.token_id} · logit ${t.logit.toFixed(3)}` + (t.count === null || t.count === undefined ? "" : ` · seen ${int(t.count)} times in training${t.rare ? " (rare)" : ""}`) },
        visibleToken(t.text, t.bytes_hex))))))))))));
}

// One head opened: each context's tokens up to the word, shaded by this head's weight on them.
function headDetail(r, l, hd) {
  return h("div", { class: "ctx-head", dataset: { layer: String(l), head: String(hd) } },
    h("h4", { text: `Layer ${l}, head ${hd}: where the word's query put its weight, in each context` }),
    r.contexts.map((c, i) => {
      const w = r.attention[i][l][hd];
      return h("p", { class: "attn-text ctx-head-text", dataset: { context: String(i) } },
        h("span", { class: "ctx-num", style: { borderColor: LINES[i] }, text: String(i + 1) }),
        w.map((x, j) => h("span", { class: "attn-tok" + (j === c.position ? " query" : ""), title: `position ${j}: ${pct(x)}`,
          style: { backgroundColor: `rgb(${weightColour(x).join(", ")})`, color: x > 0.55 ? "#fff" : null } },
        visibleToken(c.tokens[j].text, c.tokens[j].bytes_hex))));
    }));
}

// Attention side by side: a row a head, a column a context; each cell the head's weights from
// the word over the context's positions (a strip), with the token it puts most weight on.
function attentionGrid(r) {
  const n = r.contexts.length, L = r.attention[0].length, Hn = r.attention[0][0].length;
  const detail = h("div", { class: "ctx-detail" });
  const open = (l, hd) => {
    grid.querySelectorAll(".ctx-attn-row.open").forEach((b) => b.classList.remove("open"));
    grid.querySelector(`.ctx-attn-row[data-layer="${l}"][data-head="${hd}"]`).classList.add("open");
    detail.replaceChildren(headDetail(r, l, hd));
    detail.scrollIntoView({ block: "nearest" });
  };
  const cols = { gridTemplateColumns: `4.2rem repeat(${n}, minmax(0, 1fr))` };
  const grid = h("div", { class: "ctx-attn" },
    h("div", { class: "ctx-attn-head", style: cols }, h("span", { class: "attn-corner", text: "layer, head" }),
      r.contexts.map((_, i) => h("span", { class: "attn-col", style: { color: LINES[i] }, text: `context ${i + 1}` }))));
  for (let l = 0; l < L; l++) {
    for (let hd = 0; hd < Hn; hd++) {
      grid.appendChild(h("button", { type: "button", class: "ctx-attn-row", style: cols, dataset: { layer: String(l), head: String(hd) },
        "aria-label": `open layer ${l}, head ${hd} in every context`, onclick: () => open(l, hd) },
      h("span", { class: "attn-row", text: `L${l} H${hd}` }),
      r.contexts.map((c, i) => {
        const w = r.attention[i][l][hd], j = argmax(w), tok = c.tokens[j];
        return h("span", { class: "attn-cell ctx-cell", dataset: { context: String(i), top: String(j) },
          title: `context ${i + 1}: most weight on position ${j} (${JSON.stringify(tok.text)}), ${pct(w[j])}` },
        strip(w), h("span", { class: "attn-word" }, visibleToken(tok.text, tok.bytes_hex)), weightShown(w[j]));
      })));
    }
  }
  return [grid, detail];
}

// Each prompt read (the control too; one asked twice is read once) costs one lens search.
function cost(r) {
  const n = r.requests.length, reads = r.requests.filter((q) => q.kind === "lens.top_k").length || 1, each = n / reads;
  return h("p", { class: "note ctx-cost", text: `This view cost ${plural(n, "request")}, ${Number.isInteger(each) ? int(each) : each.toFixed(1)} for each of the ${plural(reads, "prompt")} read` +
    (r.control ? " (the control's included)" : "") + ": one forward pass reading the prompt's tokens up to the word (a fetch of their rows, five searches a layer, the keys written), " +
    `then one top-k search over the token vectors with every layer's vector as a query (the lens). All marked extra.` });
}

function wordLine(r) {
  const word = r.word, x = r.rarity;
  return h("p", { class: "note ctx-word-note" }, "The vector compared is the one at ", visibleToken(word.text, word.bytes_hex),
    ` (token ${word.token_id}`, x.count === null ? "" : `, seen ${int(x.count)} times in training`, ")",
    x.rare ? rareMark(x, x.rare_below) : "",
    ", its first occurrence in each prompt. GPT-2 reads left to right: only the words before it can change it, " +
    "so the greyed words after it play no part here.");
}

function render(box, r) {
  const L = r.layers.length - 1, word = r.word;
  const [grid, detail] = attentionGrid(r);
  box.replaceChildren(
    h("ol", { class: "ctx-contexts" }, r.contexts.map((c, i) => contextLine(c, i, word)),
      r.control ? contextLine(r.control, null, word) : ""),
    wordLine(r), rarityNote(r),
    h("h3", { text: "How alike the word's vectors are, layer by layer" }),
    h("p", { class: "note", text: `Cosine between the contexts' vectors at the word: 1 = the same direction. Layer 0 is the embedding, wte[word] + wpe[position]: ` +
      `there the contexts differ only by where the word stands. Each block adds what attention brought from the words before it and what the MLP made of that; ` +
      `the last point (${L}) is the vector entering ln_f, from which the model predicts the next token. ` +
      (r.control ? `The grey line (${CONTROL.label}) is the baseline: the word in two sentences of the same sense, so a pair of different senses is read against it.`
        : "No control was given: a cosine alone has no baseline.") }),
    chart(r, box.clientWidth), legend(r), summary(r),
    h("h4", { text: "What the lines say" }), reading(r),
    cosineTable(r),
    h("h3", { text: "What each context's vector would predict (the lens)" }),
    h("p", { class: "note", text: `At each layer the word's vector, through ln_f, searched against the token vectors: the top ${r.k}, best first (marked), in each context. ` +
      "Where the contexts' lists part, the model has begun to read the word differently." }),
    r.lens_note ? h("p", { class: "note ctx-lens-note", text: r.lens_note }) : "",
    lensTable(r),
    h("h3", { text: "Attention from the word, side by side" }),
    h("p", { class: "note", text: `Each strip is one head: where the word's query put its weight over the positions before it and itself (left to right, darker = more), ` +
      "with the token it puts most weight on. Tap or click a row to see that head's weights on each context's words." }),
    grid, detail, cost(r));
}

async function compare() {
  const box = $("contexts-result");
  const prompts = [...Array(MAX).keys()].map((i) => $(`ctx-p${i + 1}`).value).filter((p) => p.trim() !== "");
  const control = $("ctx-control").value.trim() === "" ? null : $("ctx-control").value;
  box.replaceChildren(placeholder("reading each prompt up to the word…"));
  $("ctx-go").disabled = true;
  try {
    const r = await api("POST", "/api/contexts", { word: $("ctx-word").value, prompts, control, k: 5 });
    render(box, r);
  } catch (e) { failed(box, e); } finally { $("ctx-go").disabled = false; }
}

function fill(s) {
  $("ctx-word").value = s.word;
  for (let i = 0; i < MAX; i++) $(`ctx-p${i + 1}`).value = s.prompts[i] || "";
  $("ctx-control").value = s.control || "";
}

export function renderContextStarters(info) {
  const starters = info && Array.isArray(info.context_starters) && info.context_starters.length ? info.context_starters : STARTERS;
  if (info) fill(starters[0]); // the form starts from the model's own first starter
  $("ctx-starters").replaceChildren(...starters.map((s) => h("button", {
    type: "button", class: "starter", dataset: { word: s.word }, title: [...s.prompts, s.control].filter(Boolean).join(" / "),
    onclick: () => { fill(s); compare(); },
  }, h("span", { class: "starter-kind", text: `${s.kind}: ${s.prompts.length} contexts` + (s.control ? " and a control" : "") }),
  h("span", { class: "starter-text", text: s.prompts.join(" / ") + (s.control ? ` (control: ${s.control})` : "") }))));
}

export function initContexts() {
  renderContextStarters(null);
  $("contexts-form").addEventListener("submit", (e) => { e.preventDefault(); compare(); });
}
