// The selected token's requests in order, as a waterfall, and below them the extra
// searches that looking inside it cost (the lens, a recomputed attention).
import { $, h, labelled, placeholder } from "./dom.js";
import { bytes, int, micro, ms, plural, roundTrips, usd, usdPlain } from "./format.js";
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
  [/^wte\.promotes$/, "the tokens each neuron shown promotes: top-k over wte"],
  [/^wte\.fetch$/, "fetch the token's wte row and the one it is compared with (attribution)"],
  [/wte/, "a search over the token vectors"],
];
// The same kind asked for by a view (not needed for the token) does another job.
const EXTRA_HELP = [
  [/^wte\.all$/, "every token's score: the normaliser of the probabilities over all tokens"],
  [/^wte\.writes$/, "the tokens each piece of an opened head's write pushes most (a top-k over the token vectors)"],
  [/attn\.c_proj$/, "what each head writes: one masked query a head (attribution)"],
  [/mlp\.c_proj$/, "what every neuron writes: row n of c_proj, a one-hot query each (the MLP as a memory)"],
];
// view: the request was a learning view's own (a rerun with parts off does the forward pass's jobs).
const kindHelp = (r, view) => ((view && r.extra && EXTRA_HELP.find(([re]) => re.test(r.kind))) || KIND_HELP.find(([re]) => re.test(r.kind)) || [null, ""])[1];

// Where each request sits in time. The searches run one after another: each waits for
// the answer of the one before (a round trip), so they follow a cursor. A concurrent
// request (a decode step's key write) starts where it was sent and runs beside them in
// its own lane: it does not move the cursor. -> {starts, path (ms of the critical path), end}
export function timeline(log) {
  let t = 0, end = 0;
  const starts = log.map((r) => {
    const at = t;
    if (!r.concurrent) t += r.ms;
    end = Math.max(end, at + r.ms);
    return at;
  });
  return { starts, path: t, end: Math.max(end, t) };
}

// The index of the slowest request on the critical path: the one a learner should see
// first (a concurrent write, however slow, makes no token wait).
const largest = (log) => log.reduce((best, r, i) => (r.concurrent ? best : best < 0 || r.ms > log[best].ms ? i : best), -1);

function requestRow(r, i, left, width, isLargest, view) {
  const what = kindHelp(r, view) + (r.concurrent ? " · runs beside the searches: no round trip of its own" : "") +
    (isLargest ? " · the slowest round trip" : "");
  return h("tr", { class: "wf-row op-" + r.op + (isLargest ? " largest" : "") + (r.concurrent ? " concurrent" : ""), dataset: { kind: r.kind } },
    h("td", { class: "num idx", text: String(i + 1) }),
    h("td", { class: "kind" },
      h("span", { class: "op op-" + r.op, title: r.op, text: r.op }),
      r.concurrent ? h("span", { class: "lane-tag", title: "sent without waiting: it runs while the next searches do", text: "beside" }) : "",
      h("code", { text: r.kind }),
      h("span", { class: "what", text: what })),
    h("td", { class: "num", title: "queries in this one request", text: r.queries ? int(r.queries) : "–" }),
    h("td", { class: "num", title: r.op === "search" ? "documents scored" : r.op === "write" ? "documents written" : "documents fetched", text: int(r.rows) }),
    h("td", { class: "num", text: bytes(r.bytes) }),
    h("td", { class: "bar-cell" }, h("div", { class: "track" },
      h("div", { class: "bar op-" + r.op + (r.concurrent ? " beside" : ""), style: { left: left.toFixed(2) + "%", width: Math.min(width, 100 - left).toFixed(2) + "%" } }))),
    h("td", { class: "num", text: ms(r.ms) }),
    h("td", { class: "num cost", title: usdPlain(r.cost_usd || 0), text: micro(r.cost_usd || 0) }));
}

function serverRow(rest, left, width) {
  return h("tr", { class: "wf-row wf-server" },
    h("td", { class: "num idx", text: "" }),
    h("td", { class: "kind" }, h("span", { class: "op op-server", text: "server" }),
      h("span", { class: "what", text: "layer norm, GELU, softmax, additions, sampling: between the round trips" })),
    h("td"), h("td"), h("td"),
    h("td", { class: "bar-cell" }, h("div", { class: "track" },
      h("div", { class: "bar op-server", style: { left: left.toFixed(2) + "%", width: Math.min(width, 100 - left).toFixed(2) + "%" } }))),
    h("td", { class: "num", text: ms(rest) }),
    h("td", { class: "num cost", text: "–" }));
}

// The table of a request log, laid out in time over `total` ms (at least the log's own
// end); `server` ms of the server's arithmetic is drawn after the critical path. `view`: a
// request marked extra is a learning view's own job (false for a rerun with parts off).
export function requestTable(log, total, server = 0, view = true) {
  const big = largest(log);
  const tl = timeline(log);
  // The server's arithmetic is drawn after the critical path; a write beside it may end later still.
  const span = Math.max(total, tl.end, tl.path + Math.max(0, server), 1e-9);
  const rows = log.map((r, i) => requestRow(r, i, (tl.starts[i] / span) * 100, Math.max(0.6, (r.ms / span) * 100), i === big, view));
  if (server > 0) rows.push(serverRow(server, (tl.path / span) * 100, Math.max(0.6, (server / span) * 100)));
  return labelled(h("table", { class: "wf-table" },
    h("thead", null, h("tr", null,
      h("th", { class: "num", text: "#" }), h("th", { text: "request" }), h("th", { class: "num", text: "queries" }),
      h("th", { class: "num", text: "rows" }), h("th", { class: "num", text: "bytes" }), h("th", { title: "when it ran, in the token's time, left to right; a write beside the searches in the lower lane", text: "when" }),
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

// A step's counts are the server's (step_json): requests, round trips, cost, time.
function summary(step, log) {
  const big = largest(log);
  return h("div", { class: "wf-summary" },
    h("div", { class: "stat stat-requests" }, h("b", { text: int(step.requests) }), h("span", { text: "requests" })),
    h("div", { class: "stat stat-trips", title: "requests that each waited for the one before: the critical path" },
      h("b", { text: int(step.round_trips) }), h("span", { text: "round trips, one after another" })),
    h("div", { class: "stat stat-total" }, h("b", { text: ms(step.ms) }), h("span", { text: "total: the round trips and the server's arithmetic" })),
    h("div", { class: "stat stat-cost", title: "at turbopuffer's list rates" }, h("b", { text: usdPlain(step.cost_usd) }),
      h("span", { text: `cost · ${usd(step.cost_usd * 1e6)} per million tokens` })),
    h("div", { class: "stat" }, h("b", { text: int(step.read || 0) }), h("span", { text: "tokens read" })),
    big >= 0 ? h("div", { class: "stat stat-largest" }, h("b", { text: `#${big + 1} ${log[big].kind}` }),
      h("span", { text: `the slowest round trip: ${ms(log[big].ms)}` })) : "");
}

function stepNote(step, log) {
  if (!log.length) return "Replayed: these candidates were already known (the model had read this prefix before), so this token cost no request.";
  const beside = log.filter((r) => r.concurrent).length;
  const order = beside
    ? `${int(step.round_trips)} of its ${int(step.requests)} requests run one after another, each waiting for the answer of the one before; ` +
      `the ${plural(beside, "key write")} (striped, in the lower lane) run beside them: nothing searches a new token's keys before the next token, so no one waits for them. ` +
      "The total is the round trips plus the server's arithmetic, not the sum of every bar."
    : `All ${int(step.requests)} requests run one after another (${plural(step.round_trips, "round trip")}), each waiting for the answer of the one before.`;
  if (step.read > 1) return `Prefill: this token's requests read all ${step.read} unread tokens at once; each search carries one query per token, so the whole prompt cost the same ${int(step.requests)} requests as one token. ` +
    "The prompt's keys are written before they are searched, so here the writes are on the path too. " + (beside ? order : "");
  return "Decode: one token read, one full pass through the model. " + order;
}

// The extra searches that "look inside" cost for this token, apart from the step's own, and
// those of its latest rerun with parts switched off.
function extraSection(p) {
  const inside = S.inside.get(insideKey(p));
  const extra = inside && inside.requests ? inside.requests : [];
  const rerun = S.ablations.get(insideKey(p));
  const step = p > 0 ? stepAt(p) : undefined;
  const all = step && step.over_all && step.over_all.requests.length ? step.over_all.requests : null;
  if (!inside && !rerun && !all) return [];
  const table = (log, view = true) => h("div", { class: "table-scroll wf-scroll" }, requestTable(log, timeline(log).end, 0, view));
  return [
    all ? h("div", { class: "wf-all" },
      h("h3", { text: `Probabilities over all tokens: ${plural(all.length, "extra request")}` }),
      h("p", { class: "note", text: "One search that scores every token vector, for the normaliser of the model's own probabilities (the candidates' “over all” columns): asked once for this step when you opened its candidates, not needed to choose the token." }),
      table(all)) : "",
    inside ? h("div", { class: "wf-extra" },
      h("h3", { text: `Looking inside: ${plural(extra.length, "extra request")}, ${plural(roundTrips(extra), "round trip")}` }),
      h("p", { class: "note", text: extra.length
        ? "The lens, what each part adds, the MLP's neurons and, where it was recomputed, the attention: searches made only to show you the inside of this token, not needed to choose it."
        : "Nothing extra here: the attention and the lens came with the generation (a lens search it made is among the step's requests above)." }),
      extra.length ? table(extra) : "") : "",
    rerun ? h("div", { class: "wf-ablate" },
      h("h3", { text: `Switching parts off: ${plural(rerun.requests.length, "extra request")}, ${plural(roundTrips(rerun.requests), "round trip")}` }),
      h("p", { class: "note", text: "The step run again with parts switched off: the tokens before it read in one prefill on a copy, then the top-k search." }),
      table(rerun.requests, false)) : ""];
}

function renderWaterfall() {
  const box = $("waterfall");
  const p = S.selected;
  const step = p !== null && p > 0 && p < S.tokens.length ? stepAt(p) : undefined;
  if (!step) {
    box.replaceChildren(placeholder(p === null
      ? "Every search, write and fetch that produced the selected token, as a waterfall."
      : "A prompt token costs no requests of its own: it was read with the rest of the prompt."), ...(p ? extraSection(p) : []));
    return;
  }
  const log = step.request_log || [];
  const path = timeline(log).path;
  const scroller = log.length ? h("div", { class: "table-scroll wf-scroll" }, requestTable(log, step.ms, step.ms - path)) : "";
  box.replaceChildren(summary(step, log), h("p", { class: "note wf-note", text: stepNote(step, log) }), scroller, ...extraSection(p));
  if (scroller) revealLargest(scroller);
}

export function initWaterfall() { view("waterfall", renderWaterfall); }
