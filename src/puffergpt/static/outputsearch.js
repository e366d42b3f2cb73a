// The next token from an index: for the selected token, the exact output search (every token
// vector scored) and the approximate one (the store's HNSW index over the token vectors) side by
// side: each one's top-k with its logits, the candidates the index missed, the rows each scored,
// and the time of each. Asked for on demand: two searches, counted as extra requests.
import { api } from "./api.js";
import { $, h, labelled, placeholder, showError, visibleToken } from "./dom.js";
import { int, ms, pct } from "./format.js";
import { withText } from "./reopen.js";
import { S, view } from "./state.js";

const K = 40;
let shown = null; // {key, v}: the view for the text state it was asked for
let loading = null;

const ef = () => Number($("output-search-ef").value) || null; // null: the index's own
const key = () => `${S.textId}|${S.selected}|${ef()}|${S.tokens.slice(0, (S.selected || 0) + 1).map((t) => t.id).join(",")}`;

function tokenCell(t, missed) {
  return h("td", { class: "tok" + (missed ? " os-missed" : "") }, visibleToken(t.text, t.bytes_hex),
    h("span", { class: "tid", text: String(t.token_id) }));
}

function side(title, s, v, found) {
  const rows = s.ids.map((id, i) => h("tr", { dataset: { tokenId: String(id) } },
    h("td", { class: "num", text: String(i + 1) }), tokenCell(s.tokens[i], found && !found.has(id)),
    h("td", { class: "num", text: s.logits[i].toFixed(4) })));
  const scored = s.rows === null
    ? "rows scored: the store does not say"
    : `rows scored: all ${int(s.rows)}`;
  return h("div", { class: "os-side" },
    h("h3", { text: title }),
    h("p", { class: "os-meta" }, h("b", { text: ms(s.ms) }), ` · ${scored}`),
    h("div", { class: "table-scroll" }, labelled(h("table", { class: "os-table" },
      h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { text: "token" }),
        h("th", { class: "num", text: "logit" }))),
      h("tbody", null, rows)))));
}

function missedList(v) {
  if (!v.missed.length) return h("p", { class: "os-none", text: `The index found all ${v.k} of the exact top ${v.k}.` });
  return h("div", { class: "os-missed-box" },
    h("h3", { text: `Missed by the index: ${v.missed.length} of the exact top ${v.k}` }),
    h("ul", { class: "os-missed-list" }, v.missed.map((m) => h("li", null,
      h("span", { class: "num", text: `#${m.rank + 1}` }), " ", visibleToken(m.token.text, m.token.bytes_hex),
      h("span", { class: "tid", text: String(m.token.token_id) }), ` logit ${m.logit.toFixed(4)}`))));
}

function summary(v) {
  const ratio = v.approximate.ms > 0 ? v.exact.ms / v.approximate.ms : null;
  const ix = v.index;
  return h("div", { class: "os-summary" },
    h("div", { class: "stat" }, h("b", { class: "os-recall", text: pct(v.recall) }), h("span", { text: `recall@${v.k}: the exact top ${v.k} the index returned` })),
    h("div", { class: "stat" }, h("b", { text: v.same_greedy ? "same" : "changed" }), h("span", { text: "greedy token" })),
    h("div", { class: "stat" }, h("b", { text: ratio === null ? "–" : `${ratio.toFixed(1)}×` }), h("span", { text: "exact time ÷ approximate time" })),
    h("p", { class: "note", text: `Exact scores every one of the ${int(v.n_vocab)} token vectors; approximate walks a ` +
      `${ix.kind.toUpperCase()} graph on ${ix.database} (m ${ix.m}, a search list of ${ix.ef_used}) and scores only the rows it visits. ` +
      `The list never holds fewer than the ${v.k} asked for, so a list below ${v.k} searches as ${v.k}: the same recall and time. ` +
      "A longer list visits more of the graph: recall rises until it stops, and a long one can take longer than the exact search, which reads every row in one pass of plain arithmetic while the graph's walk jumps from node to node. " +
      "Each logit it returns is exact for its token: only which tokens come back is approximate." }));
}

function render() {
  const box = $("output-search");
  const btn = $("output-search-run");
  btn.disabled = S.generating || S.busy || !S.textId || S.selected === null || S.selected < 1 || loading !== null;
  if (loading !== null) { box.replaceChildren(placeholder("Searching twice: every token vector, then the index…")); return; }
  if (!shown || shown.key !== key()) {
    box.replaceChildren(placeholder(S.selected ? "“Compare the searches” finds the selected token's candidates both ways." : "Select a generated token, then compare the two searches."));
    return;
  }
  const v = shown.v;
  if (!v.available) { box.replaceChildren(h("p", { class: "os-unavailable", text: v.why })); return; }
  const found = new Set(v.approximate.ids);
  box.replaceChildren(summary(v), h("div", { class: "os-sides" },
    side("Exact: every row", v.exact, v, found), side("Approximate: the index", v.approximate, v, null)), missedList(v));
}

async function run() {
  const p = S.selected;
  const k = key();
  loading = k;
  render();
  try {
    const v = await withText(() => api("POST", "/api/output_search", { text_id: S.textId, position: p, k: K, ef: ef() }));
    shown = { key: k, v };
  } catch (e) {
    showError(e);
  } finally {
    loading = null;
    render();
  }
}

export function initOutputSearch() {
  $("output-search-run").addEventListener("click", run);
  $("output-search-ef").addEventListener("change", render);
  view("output-search", render);
}
