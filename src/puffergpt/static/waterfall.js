// The selected token's requests in order, as a waterfall, and below them the extra
// searches that looking inside it cost (the lens, a recomputed attention).
import { $, h, labelled, placeholder } from "./dom.js";
import { bytes, int, micro, ms, plural, usd, usdPlain } from "./format.js";
import { S, insideKey, stepAt, view } from "./state.js";

const KIND_HELP = [
  [/^embed$/, "fetch the token's and position's vectors"],
  [/^ln$/, "fetch the layer-norm parameters"],
  [/attn\.c_attn$/, "queries, keys, values: one search"],
  [/attn\.keys$/, "write the new keys to this text"],
  [/attn\.scores$/, "attention: queries search earlier keys"],
  [/attn\.c_proj$/, "attention output projection"],
  [/mlp\.c_fc$/, "MLP up-projection (GELU after)"],
  [/mlp\.c_proj$/, "MLP down-projection"],
  [/^wte\.top_k$/, "next token: top-k over the vocabulary"],
  [/lens/, "the lens: top-k over the token vectors"],
  [/wte/, "a search over the token vectors"],
];
const kindHelp = (kind) => (KIND_HELP.find(([re]) => re.test(kind)) || [null, ""])[1];

// The index of the slowest request: the one a learner should see first.
const largest = (log) => log.reduce((best, r, i) => (best < 0 || r.ms > log[best].ms ? i : best), -1);

function requestRow(r, i, left, width, isLargest) {
  return h("tr", { class: "wf-row op-" + r.op + (isLargest ? " largest" : ""), dataset: { kind: r.kind } },
    h("td", { class: "num idx", text: String(i + 1) }),
    h("td", { class: "kind" },
      h("span", { class: "op op-" + r.op, title: r.op, text: r.op }),
      h("code", { text: r.kind }),
      h("span", { class: "what", text: kindHelp(r.kind) + (isLargest ? " · the slowest request" : "") })),
    h("td", { class: "num", title: "queries in this one request", text: r.queries ? int(r.queries) : "–" }),
    h("td", { class: "num", title: r.op === "search" ? "documents scored" : r.op === "write" ? "documents written" : "documents fetched", text: int(r.rows) }),
    h("td", { class: "num", text: bytes(r.bytes) }),
    h("td", { class: "bar-cell" }, h("div", { class: "track" },
      h("div", { class: "bar op-" + r.op, style: { left: left.toFixed(2) + "%", width: Math.min(width, 100 - left).toFixed(2) + "%" } }))),
    h("td", { class: "num", text: ms(r.ms) }),
    h("td", { class: "num cost", title: usdPlain(r.cost_usd || 0), text: micro(r.cost_usd || 0) }));
}

function serverRow(rest) {
  return h("tr", { class: "wf-row wf-server" },
    h("td", { class: "num idx", text: "" }),
    h("td", { class: "kind" }, h("span", { class: "op op-server", text: "server" }),
      h("span", { class: "what", text: "layer norm, GELU, softmax, additions, sampling" })),
    h("td"), h("td"), h("td"),
    h("td", { class: "bar-cell" }, h("div", { class: "track" })),
    h("td", { class: "num", text: ms(rest) }),
    h("td", { class: "num cost", text: "–" }));
}

// The table of a request log; rows laid out over `total` ms.
export function requestTable(log, total, withServer = 0) {
  const big = largest(log);
  let t0 = 0;
  const rows = log.map((r, i) => {
    const left = (t0 / total) * 100;
    t0 += r.ms;
    return requestRow(r, i, left, Math.max(0.6, (r.ms / total) * 100), i === big);
  });
  if (withServer > 0) rows.push(serverRow(withServer));
  return labelled(h("table", { class: "wf-table" },
    h("thead", null, h("tr", null,
      h("th", { class: "num", text: "#" }), h("th", { text: "request" }), h("th", { class: "num", text: "queries" }),
      h("th", { class: "num", text: "rows" }), h("th", { class: "num", text: "bytes" }), h("th", { text: "latency" }),
      h("th", { class: "num", text: "ms" }), h("th", { class: "num", title: "millionths of a dollar at turbopuffer's list rates", text: "µ$" }))),
    h("tbody", null, rows)));
}

// Scroll the table's own box (not the page) so that its slowest row shows.
function revealLargest(scroller) {
  const row = scroller.querySelector("tr.largest");
  if (!row) return;
  const top = row.offsetTop, bottom = top + row.offsetHeight;
  const head = scroller.querySelector("thead");
  const headH = head ? head.offsetHeight : 0;
  if (top - headH < scroller.scrollTop || bottom > scroller.scrollTop + scroller.clientHeight) {
    scroller.scrollTop = Math.max(0, top - headH - scroller.clientHeight / 3);
  }
}

function summary(step, log) {
  const big = largest(log);
  return h("div", { class: "wf-summary" },
    h("div", { class: "stat" }, h("b", { text: int(log.length) }), h("span", { text: "requests" })),
    h("div", { class: "stat" }, h("b", { text: ms(step.ms) }), h("span", { text: "total" })),
    h("div", { class: "stat", title: "at turbopuffer's list rates" }, h("b", { text: usdPlain(step.cost_usd) }),
      h("span", { text: `cost · ${usd(step.cost_usd * 1e6)} per million tokens` })),
    h("div", { class: "stat" }, h("b", { text: step.read > 1 ? int(step.read) : step.read === 1 ? "1" : "0" }), h("span", { text: "tokens read" })),
    big >= 0 ? h("div", { class: "stat stat-largest" }, h("b", { text: `#${big + 1} ${log[big].kind}` }),
      h("span", { text: `the slowest request: ${ms(log[big].ms)}` })) : "");
}

function stepNote(step, log) {
  if (!log.length) return "Replayed: these candidates were already known (the model had read this prefix before), so this token cost no request.";
  if (step.read > 1) return `Prefill: this token's requests read all ${step.read} unread tokens at once; each search carries one query per token, so the whole prompt cost the same ${log.length} requests as one token.`;
  return "Decode: one token read, one full pass through the model. Each request waits for the one before it.";
}

// The extra searches that "look inside" cost for this token, apart from the step's own.
function extraSection(p) {
  const inside = S.inside.get(insideKey(p));
  const extra = inside && inside.requests ? inside.requests : [];
  if (!inside) return "";
  const total = Math.max(extra.reduce((a, r) => a + r.ms, 0), 1e-9);
  return h("div", { class: "wf-extra" },
    h("h3", { text: `Looking inside: ${plural(extra.length, "extra request")}` }),
    h("p", { class: "note", text: extra.length
      ? "The lens and, where it was recomputed, the attention: searches made only to show you the inside of this token, not needed to choose it."
      : "Nothing extra here: the attention and the lens came with the generation (a lens search it made is among the step's requests above)." }),
    extra.length ? h("div", { class: "table-scroll wf-scroll" }, requestTable(extra, total)) : "");
}

function renderWaterfall() {
  const box = $("waterfall");
  const p = S.selected;
  const step = p !== null && p > 0 && p < S.tokens.length ? stepAt(p) : undefined;
  if (!step) {
    box.replaceChildren(placeholder(p === null
      ? "Every search, write and fetch that produced the selected token, as a waterfall."
      : "A prompt token costs no requests of its own: it was read with the rest of the prompt."), p ? extraSection(p) : "");
    return;
  }
  const log = step.request_log || [];
  const reqMs = log.reduce((a, r) => a + r.ms, 0);
  const total = Math.max(step.ms, reqMs, 1e-9);
  const scroller = log.length ? h("div", { class: "table-scroll wf-scroll" }, requestTable(log, total, log.length ? step.ms - reqMs : 0)) : "";
  box.replaceChildren(summary(step, log), h("p", { class: "note", text: stepNote(step, log) }), scroller, extraSection(p));
  if (scroller) revealLargest(scroller);
}

export function initWaterfall() { view("waterfall", renderWaterfall); }
