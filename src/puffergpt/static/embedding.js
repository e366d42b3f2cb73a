// The embedding space: a token's nearest neighbours among the token vectors, analogy
// arithmetic as one search for wte[B] - wte[A] + wte[C], and a 2D map of chosen
// tokens with the path of the selected token's residual stream through the layers.
import { api } from "./api.js";
import { $, h, labelled, placeholder, svg, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { saveButton, tokenEvidence, withData } from "./insight.js";
import { withText } from "./reopen.js";
import { S } from "./state.js";

// A failed lookup is shown in its own panel: the server's message names the
// word's tokens and suggests the leading-space form.
function failed(box, e) {
  box.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message }));
}

// What the view cost, from its request log: fetches of the words' vectors by id, and
// exact searches over all the token vectors.
function searched(requests) {
  const reqs = requests || [];
  const fetches = reqs.filter((r) => r.op === "fetch").length, searches = reqs.filter((r) => r.op === "search").length;
  const parts = [];
  if (fetches) parts.push(`${plural(fetches, "fetch", "fetches")} of the words' vectors by id`);
  if (searches) parts.push(`${plural(searches, "exact search", "exact searches")} over the ${int(S.info ? S.info.config.n_vocab : 50257)} token vectors (no index)`);
  return h("p", { class: "note searched", text: (parts.join(", then ") || "no requests") + "." });
}

const untrainedMark = () => h("span", { class: "untrained-mark", title: "this token's row was never trained: it is (nearly) the same vector as many others", text: "untrained" });

// A row seen rarely in training: marked with its count (views._rarity decides, the page shows).
export const rareMark = (r, below) => h("span", { class: "rare-mark", title: `seen ${int(r.count)} times in training (fewer than ${below}): its vector barely moved from where it started`, text: "rare" });

function resultsTable(results, below) {
  return labelled(h("table", { class: "emb-table" },
    h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { text: "token" }), h("th", { class: "num", text: "cosine" }),
      h("th", { class: "num", title: "how many times the token was seen in training", text: "seen" }))),
    h("tbody", null, results.map((r, i) => h("tr", { class: r.untrained ? "untrained" : r.rare ? "rare" : null, dataset: { tokenId: String(r.token_id), count: r.count === null || r.count === undefined ? "" : String(r.count) } },
      h("td", { class: "num", text: String(i + 1) }),
      h("td", { class: "tok" }, visibleToken(r.text, r.bytes_hex), h("span", { class: "tid", text: String(r.token_id) }), r.untrained ? untrainedMark() : r.rare ? rareMark(r, below) : ""),
      h("td", { class: "num", text: r.score.toFixed(4) }),
      h("td", { class: "num seen", text: r.count === null || r.count === undefined ? "unknown" : int(r.count) }))))));
}

// What the server says about rows that were never trained: the words asked about that
// are such rows, how many untrained rows it left out of the ranking, and its note.
function honesty(r) {
  const kids = [];
  const inputs = r.untrained_inputs || [];
  if (inputs.length) {
    kids.push(h("p", { class: "emb-warning untrained-inputs", role: "status" }, "Never trained: ",
      inputs.map((w, i) => [i ? ", " : "", visibleToken(String(w))]),
      inputs.length === 1 ? ". Its vector is the untrained one many tokens share, so what is near it means nothing." : ". Their vectors are the untrained ones many tokens share, so what is near them means nothing."));
  }
  if (r.untrained_skipped) {
    kids.push(h("p", { class: "note untrained-skipped", text: `${plural(r.untrained_skipped, "untrained row")} left out of the ranking: rows the model never trained tie with each other and would fill the list.` }));
  }
  if (r.note) kids.push(h("p", { class: "note emb-server-note", text: r.note }));
  if (r.rare_note) kids.push(h("p", { class: r.counts_known ? "emb-warning rare-note" : "note rare-note", role: "status", text: (r.counts_known ? `Rows seen fewer than ${r.rare_below} times in training are marked: ` : "") + r.rare_note + "." }));
  return kids;
}

const kOf = (id) => Math.max(1, Math.min(50, Number($(id).value) || 10));

async function neighbours() {
  const box = $("neighbours-result");
  box.replaceChildren(placeholder("searching…"));
  try {
    const r = await api("POST", "/api/neighbours", { word: $("nb-word").value, k: kOf("nb-k") });
    box.replaceChildren(h("p", { class: "note" }, "Nearest to ", visibleToken(r.token.text), ` (token ${r.token.token_id}), by cosine:`),
      ...honesty(r), resultsTable(r.results, r.rare_below), searched(r.requests));
  } catch (e) { failed(box, e); }
}

async function analogy() {
  const box = $("analogy-result");
  box.replaceChildren(placeholder("searching…"));
  try {
    const r = await api("POST", "/api/analogy", { a: $("an-a").value, b: $("an-b").value, c: $("an-c").value, k: kOf("an-k") });
    const t = (x) => visibleToken(r.tokens[x].text);
    box.replaceChildren(h("p", { class: "note" }, "One search for wte[", t("b"), "] − wte[", t("a"), "] + wte[", t("c"), "], the three excluded:"),
      ...honesty(r), resultsTable(r.results, r.rare_below), searched(r.requests), analogySave(r));
  } catch (e) { failed(box, e); }
}

// An analogy's evidence rides on the selected token: the notebook replays a text's
// scores, and the analogy's own result is kept as data beside them.
function analogySave(r) {
  const build = () => {
    const ev = tokenEvidence("analogy");
    const data = { terms: ["a", "b", "c"].map((x) => r.tokens[x].text), term_ids: ["a", "b", "c"].map((x) => r.tokens[x].token_id),
      ids: r.results.map((x) => x.token_id), scores: r.results.map((x) => x.score) };
    const texts = [...r.results, ...Object.values(r.tokens)].map((x) => [x.token_id, x.text]);
    return [withData(ev, data), texts, `This analogy, saved with the token you selected at position ${ev.position} (its scores are what replay re-checks).`];
  };
  return h("div", { class: "actions save-row" }, saveButton(build, "Save this analogy as insight"));
}

// The card's analogies (views.CARD_ANALOGIES), each asked with the search above: how many come out right.
async function cardAnalogies() {
  const box = $("card-result");
  box.replaceChildren(placeholder("asking each analogy…"));
  try {
    const r = await api("POST", "/api/analogy/card");
    const model = S.info ? S.info.model : "this model";
    const skipped = r.listed - r.tried;
    box.replaceChildren(
      h("p", { class: "card-score", dataset: { right: String(r.right), tried: String(r.tried) } }, h("b", { text: `${model} gets ${r.right} of the card's ${r.tried} analogies right` }),
        ` with this same search (the top answer is the wanted word)` + (skipped ? `; ${plural(skipped, "more is", "more are")} listed but not tried, a word not being one trained token.` : ".")),
      h("ul", { class: "card-list" }, r.results.map((x) => h("li", { class: x.ok ? "ok" : "bad", text:
        `${JSON.stringify(x.a)} : ${JSON.stringify(x.b)} :: ${JSON.stringify(x.c)} : ? → ${x.answers.map((t) => JSON.stringify(t)).join(", ")}` + (x.ok ? " (right)" : ` (wanted ${JSON.stringify(x.want)})`) }))),
      searched(r.requests));
  } catch (e) { failed(box, e); }
}

// --- the map ---
const W = 360, H = 260, PAD = 28;

function scaler(all) {
  const xs = all.map((p) => p.x), ys = all.map((p) => p.y);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  // A direction with no spread (a degenerate projection) puts everything on the middle line.
  const flatX = x1 - x0 < 1e-9, flatY = y1 - y0 < 1e-9;
  const sx = (W - 2 * PAD) / Math.max(x1 - x0, 1e-9), sy = (H - 2 * PAD) / Math.max(y1 - y0, 1e-9);
  return (p) => [flatX ? W / 2 : PAD + (p.x - x0) * sx, flatY ? H / 2 : H - PAD - (p.y - y0) * sy];
}

// Labels placed so that none covers another: each tries the right, the left, above and
// below its point, and one that fits nowhere is left off (counted, its point keeps a
// tooltip). Boxes are estimated from the monospace font (.map-point and .map-step text: 12px);
// ``taken`` holds the boxes already placed (the path's step numbers go first).
const CHAR_W = 7.4, LINE_H = 15; // a 12px monospace glyph's advance, a line with its descent
function placeLabels(points, at, taken = []) {
  const hit = (b) => b[0] < 0 || b[2] > W || b[1] < 0 || b[3] > H || taken.some((t) => b[0] < t[2] && b[2] > t[0] && b[1] < t[3] && b[3] > t[1]);
  return points.map((p) => {
    const [x, y] = at(p);
    const w = p.label.length * CHAR_W;
    const tries = [[x + 6, y + 4, "start"], [x - 6, y + 4, "end"]];
    for (let k = 0; k < 3; k++) tries.push([x - w / 2, y - 10 - k * LINE_H, "start"], [x - w / 2, y + 19 + k * LINE_H, "start"]);
    for (const [tx, ty, anchor] of tries) {
      const x0 = anchor === "end" ? tx - w : tx;
      const box = [x0, ty - 11.5, x0 + w, ty + 3.5];
      if (!hit(box)) { taken.push(box); return { x: tx, y: ty, anchor }; }
    }
    return null;
  });
}

// The path's steps grouped where their points crowd (within a label's height of the group's
// first): one number a group ("2–4" for steps 2 to 4), so the numbers never clump.
function stepGroups(path, at) {
  const groups = [];
  path.forEach((p, i) => {
    const [x, y] = at(p), g = groups[groups.length - 1];
    if (g && Math.hypot(x - g.x, y - g.y) < LINE_H) g.last = i;
    else groups.push({ first: i, last: i, x, y });
  });
  return groups.map((g) => ({ ...g, label: g.first === g.last ? String(path[g.first].layer) : `${path[g.first].layer}–${path[g.last].layer}` }));
}

function pathSvg(path, at, taken) {
  const groups = stepGroups(path, at);
  const places = placeLabels(groups.map((g) => ({ ...path[g.first], label: g.label })), at, taken);
  const labelOf = new Map(groups.map((g, k) => [g.first, [g, places[k]]]));
  const pts = path.map((p) => at(p).map((v) => v.toFixed(1)).join(",")).join(" ");
  return [svg("polyline", { class: "map-path", points: pts }), ...path.map((p, i) => {
    const [x, y] = at(p), [g, place] = labelOf.get(i) || [null, null];
    return svg("g", { class: "map-step", dataset: { layer: String(p.layer), labelled: g ? String(!!place) : "grouped" } },
      svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: i === path.length - 1 ? 5 : 3.5 }),
      place ? svg("text", { x: place.x.toFixed(1), y: place.y.toFixed(1), "text-anchor": place.anchor, text: g.label }) : null,
      svg("title", { text: `the residual stream entering block ${p.layer}` + (p.layer === 0 ? " (the embedding)" : "") }));
  })];
}

function mapSvg(r) {
  const at = scaler([...r.points, ...r.path]);
  const taken = [];
  const kids = r.path.length ? pathSvg(r.path, at, taken) : [];
  const places = placeLabels(r.points, at, taken);
  r.points.forEach((p, i) => {
    const [x, y] = at(p);
    const place = places[i];
    kids.push(svg("g", { class: "map-point" + (p.untrained ? " untrained" : p.rare ? " rare" : ""), dataset: { tokenId: String(p.token_id), labelled: String(!!place) } },
      svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 4 }),
      place ? svg("text", { x: place.x.toFixed(1), y: place.y.toFixed(1), "text-anchor": place.anchor, text: p.label.replace(/ /g, "·") }) : null,
      svg("title", { text: `token ${p.token_id}: ${JSON.stringify(p.label)}${p.untrained ? " · never trained" : ""}${p.count === null || p.count === undefined ? "" : ` · seen ${p.count} times in training`}` })));
  });
  return svg("svg", { class: "map", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "2D map of token vectors" }, kids);
}

// The map's path follows the selected token's predictor (position p-1), when there is one.
const pathPosition = () => (S.textId && S.selected !== null && S.selected > 0 && S.selected <= S.readUpto ? S.selected : null);

async function drawMap() {
  const box = $("map-result");
  const words = $("map-words").value.split("\n").filter((w) => w.trim() !== "");
  const position = $("map-path").checked ? pathPosition() : null;
  box.replaceChildren(placeholder("projecting…"));
  try {
    const r = position === null ? await api("POST", "/api/map", { words, text_id: null, position })
      : await withText(() => api("POST", "/api/map", { words, text_id: S.textId, position }));
    const ev = (r.explained || []).map((v) => (v * 100).toFixed(0) + "%").join(" and ");
    const map = mapSvg(r);
    const hidden = map.querySelectorAll('.map-point[data-labelled="false"]').length;
    const untrained = r.points.filter((p) => p.untrained).length;
    box.replaceChildren(
      r.degenerate ? h("p", { class: "emb-warning map-degenerate", role: "status", text: "This projection is degenerate: the tokens shown do not spread over two directions " +
        "(several are the same vector, or lie on one line), so their places on this plane say little." + (r.note ? " " + r.note : "") }) : "",
      map,
      hidden ? h("p", { class: "note map-hidden", text: `${plural(hidden, "label")} left off where it would cover another: hover or tap a point for its token.` }) : "",
      untrained ? h("p", { class: "note map-untrained", text: `${plural(untrained, "token")} marked untrained: the model never trained their rows (they sit on the untrained vector many tokens share).` }) : "",
      !r.degenerate && r.note ? h("p", { class: "note emb-server-note", text: r.note }) : "",
      r.axis_note ? h("p", { class: "note map-axis" + (r.axis_frequency && r.axis_frequency.is_frequency ? " emb-warning" : ""),
        dataset: { pearson: r.axis_frequency ? String(r.axis_frequency.pearson) : "" }, text: `Axis 1: ${r.axis_note}.` }) : "",
      h("p", { class: "note", text: `A projection onto the two main directions of the tokens shown (PCA${ev ? `, ${ev} of their spread` : ""}). ` +
        (r.path.length ? `The line is the vector of position ${position - 1} entering each block, numbered by layer (steps that lie on top of each other share one number, 2–4): the path the model moved it along as it read, toward predicting the token at position ${position} (that token is not drawn: the map shows only the words listed).`
          : "Select a generated token and tick the box to see its path through the layers.") }),
      searched(r.requests));
  } catch (e) { failed(box, e); }
}

export function initEmbedding() {
  const submit = (id, fn) => $(id).addEventListener("submit", (e) => { e.preventDefault(); fn(); });
  submit("neighbours-form", neighbours);
  submit("analogy-form", analogy);
  submit("map-form", drawMap);
  $("card-go").addEventListener("click", cardAnalogies);
}
