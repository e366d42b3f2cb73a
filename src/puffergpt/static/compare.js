// Search vs. numpy: the same prompt through the vector searches and through a plain
// numpy GPT-2 with the same weights, the next-token scores side by side.
import { readTopK } from "./actions.js";
import { api } from "./api.js";
import { $, clearError, h, labelled, placeholder, showError, visibleToken } from "./dom.js";
import { int, ms } from "./format.js";

function stats(r) {
  const diff = r.max_abs_diff;
  const load = r.reference.load_ms; // reading the checkpoint, once: not part of the timing
  return h("div", { class: "cmp-summary" },
    h("div", { class: "stat big-stat" }, h("b", { class: "max-diff", text: diff === null ? "n/a" : diff.toExponential(2) }), h("span", { text: "max |search − numpy|" })),
    h("div", { class: "stat" }, h("b", { text: r.same_ids ? "yes" : "no" }), h("span", { text: "same tokens, same order" })),
    h("div", { class: "stat" }, h("b", { text: `${int(r.search.requests)} req · ${ms(r.search.ms)}` }), h("span", { text: "vector search" })),
    h("div", { class: "stat" }, h("b", { text: ms(r.reference.ms) }),
      h("span", { text: load ? `numpy, weights in memory (loading them took ${ms(load)}, not counted)` : "numpy, weights in memory" })));
}

function rowOf(row) {
  const d = row.reference === null ? null : Math.abs(row.search - row.reference);
  return h("tr", null,
    h("td", { class: "num", text: String(row.rank + 1) }),
    h("td", { class: "tok" }, visibleToken(row.text, row.bytes_hex), h("span", { class: "tid", text: String(row.token_id) })),
    h("td", { class: "num", text: row.search.toFixed(6) }),
    h("td", { class: "num", text: row.reference === null ? "not in numpy's top-k" : row.reference.toFixed(6) }),
    h("td", { class: "num", text: d === null ? "–" : d.toExponential(1) }));
}

function show(box, r) {
  const table = labelled(h("table", { class: "cmp-table" },
    h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { text: "token" }),
      h("th", { class: "num", text: "search logit" }), h("th", { class: "num", text: "numpy logit" }), h("th", { class: "num", text: "|diff|" }))),
    h("tbody", null, r.rows.map(rowOf))));
  box.replaceChildren(stats(r),
    h("p", { class: "note", text: `The next-token scores for the ${int(r.prompt_tokens)}-token prompt, computed by searches in the store and by a plain numpy GPT-2 with the same weights. The differences are float32 rounding.` }),
    h("div", { class: "table-scroll" }, table));
}

async function compare() {
  clearError();
  const prompt = $("prompt").value;
  const box = $("compare-result");
  if (!prompt.trim()) { showError(new Error("type a prompt first")); return; }
  let top_k;
  try { top_k = readTopK(); } catch (e) { showError(e); return; }
  const btn = $("compare");
  btn.disabled = true;
  box.replaceChildren(placeholder("Running the prompt twice: through the searches, and through numpy…"));
  box.closest("section").scrollIntoView({ block: "start", behavior: "smooth" }); // the result is far below the button
  try {
    show(box, await api("POST", "/api/compare", { prompt, top_k }));
    box.closest("section").scrollIntoView({ block: "start", behavior: "smooth" });
  } catch (e) {
    box.replaceChildren();
    showError(e);
    $("error").scrollIntoView({ block: "nearest" });
  } finally {
    btn.disabled = false;
  }
}

export function initCompare() { $("compare").addEventListener("click", compare); }
