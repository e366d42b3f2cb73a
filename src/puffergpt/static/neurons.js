// The MLP as a memory (Geva et al., 2021): at layer l, a neuron's activation is one
// entry of the c_fc product the step already searched (after GELU): no request. What
// neuron n writes is row n of mlp.c_proj, and the tokens it promotes are a top-k search
// over wte with that row as the query. Per layer: the most active neurons, how active,
// what each promotes, and the searches that found them (from the view's request log).
import { h, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { S } from "./state.js";

// The last request of a kind: the view's own (a recomputed forward pass has earlier ones).
const lastOf = (requests, kind) => [...(requests || [])].reverse().find((r) => r.kind === kind && r.extra);

function searchLine(r, what) {
  if (!r) return null;
  return h("li", null, h("code", { text: r.kind }), ` ${r.op}, ${plural(r.queries, "query", "queries")}: ${what}`);
}

function neuronRow(n, top) {
  const toks = n.promotes.map((t) => t.token || { text: `#${t.token_id}`, token_id: t.token_id });
  return h("div", { class: "neuron", dataset: { neuron: String(n.neuron) } },
    h("span", { class: "neuron-id", text: `n ${n.neuron}` }),
    h("span", { class: "neuron-act", title: `activation (GELU output) ${n.activation.toFixed(4)}` },
      h("span", { class: "neuron-bar", style: { width: (Math.max(0, n.activation / top) * 100).toFixed(1) + "%" } }),
      h("span", { class: "neuron-val num", text: n.activation.toFixed(3) })),
    h("span", { class: "neuron-promotes" }, toks.map((t, i) => h("span", {
      class: "lens-chip", title: `token ${t.token_id} · score ${n.promotes[i].score.toFixed(3)} (c_proj row · wte)` }, visibleToken(t.text, t.bytes_hex)))));
}

function layerBlock(l, list, requests) {
  const top = Math.max(...list.map((n) => n.activation), 1e-12);
  const cproj = lastOf(requests, `h.${l}.mlp.c_proj`);
  return h("div", { class: "neuron-layer", dataset: { layer: String(l) } },
    h("h4", { text: `Layer ${l}: its ${plural(list.length, "most active neuron")}` }),
    h("div", { class: "neurons" }, list.map((n) => neuronRow(n, top))),
    cproj ? h("ul", { class: "note neuron-searches" },
      h("li", null, h("code", { text: `h.${l}.mlp.c_fc` }), ": the activations, from this token's own pass through the layer (no request of their own)"),
      searchLine(cproj, "the rows of c_proj the neurons write (one masked query each, and one for the bias)")) : "");
}

// The neurons part of a token's inside view, into `box`.
export function renderNeurons(box, view) {
  const layers = view.neurons;
  if (!layers || !layers.length) { box.replaceChildren(); return; }
  const promotes = lastOf(view.requests, "wte.promotes");
  box.replaceChildren(
    h("h3", { text: "The MLP as a memory" }),
    h("p", { class: "note", text: `Each MLP has ${S.info ? int(4 * S.info.config.n_embd) : "4 × width"} neurons. At position ${view.query_position}, these are each layer's most active ones (the largest GELU outputs of mlp.c_fc). ` +
      "What neuron n adds to the residual is row n of mlp.c_proj times its activation; the tokens it promotes are the answer of a top-k search over the token vectors (wte) with that row as the query: " +
      "the neuron as a key (c_fc) that, when it fires, writes a value (c_proj) pointing at these tokens." }),
    promotes ? h("p", { class: "note neuron-promotes-search" }, "Promoted tokens: ", h("code", { text: promotes.kind }),
      ` — one search, ${plural(promotes.queries, "query", "queries")} (every neuron of every layer), listed with this view's requests in the waterfall.`) : "",
    ...layers.map((list, l) => layerBlock(l, list, view.requests)));
}
