// The KV cache, visible: the text's namespace of keys. Which positions have keys,
// which batch wrote them (the prefill's one batch, each decode step's one), what a
// step back keeps and what a branch overwrites.
import { api, textPath } from "./api.js";
import { $, h, labelled, placeholder, streamToken } from "./dom.js";
import { int, plural } from "./format.js";
import { withText } from "./reopen.js";
import { S, stepAt, view } from "./state.js";

let shownFor = null; // the text state the panel shows
let pending = false;

const stamp = () => `${S.textId}|${S.length}|${S.readUpto}|${S.tokens.map((t) => t.id).join(",")}`;

function cellTitle(pos, kv) {
  const w = pos.written_by;
  if (!pos.stored) return `position ${pos.position}: no keys yet (the model reads it when it generates the next token)`;
  const how = w.phase === "prefill" ? `written by the prefill, batch ${w.batch}` : w.phase === "decode" ? `written by the decode step for position ${w.step}, batch ${w.batch}` : `written when the text was read, batch ${w.batch}`;
  const kept = pos.position >= kv.length ? " · kept after a step back: Forward reuses it" : "";
  return `position ${pos.position}: ${int(kv.layers * kv.heads)} keys (${kv.layers} layers × ${kv.heads} heads), ${how}${kept}`;
}

function strip(kv) {
  return h("div", { class: "kv-strip" }, kv.positions.map((pos) => {
    const phase = pos.stored ? pos.written_by.phase : "none";
    const kept = pos.stored && pos.position >= kv.length;
    return h("span", { class: `kv-pos kv-${phase}${kept ? " kv-kept" : ""}`, title: cellTitle(pos, kv),
      dataset: { position: String(pos.position), stored: String(pos.stored), phase } },
      h("span", { class: "kv-n", text: String(pos.position) }), h("span", { class: "kv-tok" }, streamToken(pos.text, pos.bytes_hex)));
  }));
}

// A batch's requests are those of the step that read it (the one for position `end`),
// as the waterfall and the Prefill and decode panel count them: the read and its final
// top-k search. Where this page does not hold that step, the read's own count is shown, named so.
function batchCounts(w) {
  const step = stepAt(w.end);
  if (step && step.read === w.end - w.start) return { requests: step.requests, trips: step.round_trips, of: `the step for position ${w.end}` };
  return { requests: w.requests, trips: null, of: "the read alone, without its final top-k search" };
}

function writesTable(kv) {
  return labelled(h("table", { class: "kv-writes" },
    h("thead", null, h("tr", null, h("th", { class: "num", text: "batch" }), h("th", { text: "phase" }),
      h("th", { text: "positions" }), h("th", { class: "num", text: "keys" }),
      h("th", { class: "num", title: "the requests of the step that read this batch, as its waterfall counts them", text: "requests" }),
      h("th", { class: "num", text: "round trips" }))),
    h("tbody", null, kv.writes.map((w) => {
      const n = batchCounts(w);
      return h("tr", { class: "kv-" + w.phase, dataset: { end: String(w.end) } },
        h("td", { class: "num", text: String(w.batch) }), h("td", { text: w.phase }),
        h("td", { text: w.end - w.start > 1 ? `${w.start} to ${w.end - 1}` : String(w.start) }),
        h("td", { class: "num", text: int((w.end - w.start) * kv.layers * kv.heads) }),
        h("td", { class: "num kv-requests", title: n.of, text: int(n.requests) }),
        h("td", { class: "num kv-trips", title: n.of, text: n.trips === null ? "–" : int(n.trips) }));
    }))));
}

function why(kv) {
  return h("div", { class: "kv-why" },
    h("h3", { text: "Why decode reads only the new token" }),
    h("p", { text: "A token's key and value depend only on the tokens up to it, never on later ones, so once written they never change. " +
      "The prefill reads the whole prompt in one pass and writes every position's keys in one batch. " +
      "After that, each new token needs only its own query, key and value: its query searches the keys already stored, " +
      "and its key is added for the tokens that come later. Reading the whole text again would give the same keys and cost far more." }),
    h("p", { text: `A step back deletes nothing: the keys of the positions after it stay (shown faded), and Forward uses them again for free. ` +
      `A branch or a cut at position p keeps the keys before p and writes new ones from p on, over the old: ` +
      `attention only ever searches positions at or before its own, so a stale key after p is never read.` }),
    kv.per_layer ? h("p", { class: "note", text: `Counted in the store: ${plural(kv.documents, "key document")} in namespace ${kv.namespace}; ${kv.per_layer.map((n, l) => `layer ${l}: ${int(n)}`).join(", ")}.` }) : "");
}

function show(kv) {
  const stored = kv.positions.filter((p) => p.stored).length;
  const asked = (kv.requests || []).length; // counting the keys is itself a request or two
  $("kv").replaceChildren(
    h("p", { class: "note", text: `${plural(stored, "position")} of ${int(kv.known)} known have keys: ${int(kv.layers)} layers × ${int(kv.heads)} heads each, tagged layer, head and position. ` +
      `The text is ${int(kv.length)} tokens long; the model has read ${int(kv.read_upto)}. Reading this panel cost ${plural(asked, "request")}.` }),
    h("div", { class: "legend kv-legend" },
      h("span", null, h("span", { class: "swatch kv-prefill" }), "prefill (one batch)"),
      h("span", null, h("span", { class: "swatch kv-decode" }), "a decode step"),
      h("span", null, h("span", { class: "swatch kv-read" }), "read with appended text"),
      h("span", null, h("span", { class: "swatch kv-none" }), "no keys yet"),
      h("span", null, h("span", { class: "swatch kv-kept" }), "kept after a step back")),
    strip(kv), h("div", { class: "table-scroll" }, writesTable(kv)),
    h("p", { class: "note", text: "A batch's requests and round trips are those of the step that read it, as its waterfall and the Prefill and decode panel count them: the read and its final top-k search." }),
    why(kv));
}

async function refresh() {
  const want = stamp();
  pending = true;
  try {
    show(await withText(() => api("GET", textPath(S.textId, "/kv"))));
    shownFor = want;
  } catch (e) {
    $("kv").replaceChildren(h("p", { class: "emb-error", text: "The KV cache could not be read: " + e.message }));
    shownFor = want;
  } finally {
    pending = false;
  }
  if (shownFor !== stamp()) renderKv(); // the text changed while it was being read
}

// Redrawn when the text changes and no generation is running (reading it is no search).
function renderKv() {
  if (!S.textId) {
    shownFor = null;
    $("kv").replaceChildren(placeholder("Generate to see the keys this text has stored."));
    return;
  }
  if (!S.generating && !pending && shownFor !== stamp()) refresh();
}

export function initKv() { view("kv", renderKv); }
