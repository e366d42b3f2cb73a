// The MLP as a memory (Geva et al., 2021): at layer l, a neuron's activation is one entry of
// the c_fc product the step already searched (after GELU): no request. What neuron n writes
// is row n of mlp.c_proj (one search a layer, a one-hot query each), and the tokens it
// promotes are a top-k search over wte with that row as the query. Each layer's neurons ranked
// two ways: the most active, each with its push on the chosen token (activation × the row
// read through ln_f as "what each part adds" reads a part), and, asked for (every neuron's row:
// the whole of each c_proj), those that push the chosen token most. The two lists differ, and
// the page says by how much.
import { h, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { signed } from "./attribution.js";
import { S } from "./state.js";

let ranking = "active"; // which list the panel shows: "active" or "pushing"

// The last request of a kind: the view's own (a recomputed forward pass has earlier ones).
const lastOf = (requests, kind) => [...(requests || [])].reverse().find((r) => r.kind === kind && r.extra);

function searchLine(r, what) {
  if (!r) return null;
  return h("li", null, h("code", { text: r.kind }), ` ${r.op}, ${plural(r.queries, "query", "queries")}: ${what}`);
}

function neuronRow(n, top, both) {
  const toks = n.promotes.map((t) => t.token || { text: `#${t.token_id}`, token_id: t.token_id });
  return h("div", { class: "neuron" + (both ? " both" : ""), dataset: { neuron: String(n.neuron), push: String(n.push) } },
    h("span", { class: "neuron-id", title: both ? "in both lists" : null, text: `n ${n.neuron}${both ? " •" : ""}` }),
    h("span", { class: "neuron-act", title: `activation (GELU output) ${n.activation.toFixed(4)}` },
      h("span", { class: "neuron-bar", style: { width: (Math.max(0, n.activation / top) * 100).toFixed(1) + "%" } }),
      h("span", { class: "neuron-val num", text: n.activation.toFixed(3) })),
    h("span", { class: "neuron-push num " + (n.push >= 0 ? "pos" : "neg"), title: "activation × the neuron's effect on the chosen token's logit",
      text: signed(n.push) }),
    h("span", { class: "neuron-promotes" }, toks.map((t, i) => h("span", {
      class: "lens-chip", title: `token ${t.token_id} · score ${n.promotes[i].score.toFixed(3)} (c_proj row · wte)` }, visibleToken(t.text, t.bytes_hex)))));
}

function layerBlock(l, list, other, requests, tok, mode) {
  const top = Math.max(...list.map((n) => n.activation), 1e-12);
  const others = new Set((other || []).map((n) => n.neuron)); // other: the other ranking's list (null: not asked)
  const both = list.filter((n) => others.has(n.neuron)).map((n) => `n ${n.neuron}`);
  const cproj = lastOf(requests, `h.${l}.mlp.c_proj`);
  const title = mode === "active" ? `Layer ${l}: its ${plural(list.length, "most active neuron")}`
    : [`Layer ${l}: the ${plural(list.length, "neuron")} that push `, visibleToken(tok.text, tok.bytes_hex), " most"];
  return h("div", { class: "neuron-layer", dataset: { layer: String(l) } },
    h("h4", null, title),
    other ? h("p", { class: "note neuron-both", text: both.length ? `In both lists (•): ${both.join(", ")}.` : "No neuron of this layer is in both lists." }) : "",
    h("div", { class: "neurons" },
      h("div", { class: "neuron-head", "aria-hidden": "true" }, h("span", { text: "neuron" }), h("span", { text: "activation" }),
        h("span", { class: "num", text: "push" }), h("span", { text: "tokens its row promotes" })),
      list.map((n) => neuronRow(n, top, others.has(n.neuron)))),
    cproj ? h("ul", { class: "note neuron-searches" },
      h("li", null, h("code", { text: `h.${l}.mlp.c_fc` }), ": the activations, from this token's own pass through the layer (no request of their own)"),
      searchLine(cproj, cproj.queries > list.length + 1 ? "every neuron's row of c_proj (a one-hot query each, and one for the bias)"
        : "the rows of c_proj the neurons listed write (a one-hot query each, and one for the bias)")) : "");
}

// askPushing(): fetch the view again with the pushing ranking (it costs every neuron's row).
function switcher(box, view, tok, askPushing, busy, mode) {
  const pick = (name) => {
    ranking = name;
    if (name === "pushing" && !view.pushing) askPushing(); else renderNeurons(box, view, askPushing, busy);
  };
  const button = (name, label) => h("button", { type: "button", class: "neuron-rank" + (mode === name ? " on" : ""),
    "aria-pressed": String(mode === name), dataset: { rank: name }, disabled: busy, onclick: () => pick(name) }, label);
  const n = S.info ? S.info.config.n_layer : null;
  return h("div", { class: "neuron-ranking", role: "group", "aria-label": "rank the neurons by" },
    h("span", { text: "Rank by:" }), button("active", "most active"),
    button("pushing", ["pushing ", visibleToken(tok.text, tok.bytes_hex), " most"]),
    view.pushing ? "" : h("span", { class: "note neuron-cost", text: `Ranking by push reads every neuron's row: ${n === null ? "one search a layer" : plural(n, "search", "searches")} of ` +
      `${S.info ? int(4 * S.info.config.n_embd + 1) : "4 × width + 1"} one-hot queries (the whole of each c_proj), counted in the waterfall.` }));
}

// The neurons part of a token's inside view, into `box`; askPushing() asks the server for the
// neurons pushing the token most (busy while a view is being fetched).
export function renderNeurons(box, view, askPushing, busy) {
  const active = view.neurons, pushing = view.pushing || [];
  if (!active || !active.length) { box.replaceChildren(); return; }
  const mode = pushing.length ? ranking : "active"; // the pushing list is shown once it is there
  const a = view.attribution || {};
  const tok = a.token || { text: `#${a.token_id}` };
  const shown = mode === "active" ? active : pushing;
  const other = !pushing.length ? null : mode === "active" ? pushing : active;
  const promotes = lastOf(view.requests, "wte.promotes");
  const shared = active.reduce((s, l, i) => s + l.filter((n) => (pushing[i] || []).some((m) => m.neuron === n.neuron)).length, 0);
  const total = active.reduce((s, l) => s + l.length, 0);
  box.replaceChildren(
    h("h3", { text: "The MLP as a memory" }),
    h("p", { class: "note" }, `Each MLP has ${S.info ? int(4 * S.info.config.n_embd) : "4 × width"} neurons. At position ${view.query_position}, each layer's neurons ranked two ways. ` +
      "Most active: the largest GELU outputs of mlp.c_fc. Pushing ", visibleToken(tok.text, tok.bytes_hex), " most: activation × what the neuron's row of mlp.c_proj adds to that token's logit, read through ln_f as in “What each part adds” " +
      "(a layer's pushes and its c_proj bias sum to its MLP's part). The tokens a neuron promotes are a top-k search over the token vectors (wte) with its row as the query: " +
      "the neuron as a key (c_fc) that, when it fires, writes a value (c_proj) pointing at these tokens."),
    pushing.length ? h("p", { class: "neuron-differ" }, h("b", { text: "The two rankings differ: " }),
      `${shared} of the ${plural(total, "most active neuron")} ${shared === 1 ? "is" : "are"} among those pushing `, visibleToken(tok.text, tok.bytes_hex),
      " most. Firing hard is not the same as pushing this token: a neuron's row may point at other tokens, or against this one.")
      : h("p", { class: "neuron-differ" }, h("b", { text: "Most active is not most pushing: " }), "the push column is each neuron's share of ", visibleToken(tok.text, tok.bytes_hex),
        "'s logit; a neuron that fires hard may push it little, or down. Rank by push to see the neurons that push it most."),
    switcher(box, view, tok, askPushing, busy, mode),
    promotes ? h("p", { class: "note neuron-promotes-search" }, "Promoted tokens: ", h("code", { text: promotes.kind }),
      ` — one search, ${plural(promotes.queries, "query", "queries")} (each neuron listed, ${pushing.length ? "both rankings, " : ""}every layer), listed with this view's requests in the waterfall.`) : "",
    ...shown.map((list, l) => layerBlock(l, list, other && (other[l] || []), view.requests, tok, mode)));
}
