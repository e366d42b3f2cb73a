// The embedding space: a token's nearest neighbours among the token vectors, analogy
// arithmetic as one search for wte[B] - wte[A] + wte[C], and a 2D map of chosen
// tokens with the path of the selected token's residual stream through the layers.
import { api } from "./api.js";
import { $, h, labelled, placeholder, svg, visibleToken } from "./dom.js";
import { int, plural } from "./format.js";
import { saveButton, tokenEvidence } from "./insight.js";
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

function resultsTable(results) {
  return labelled(h("table", { class: "emb-table" },
    h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { text: "token" }), h("th", { class: "num", text: "cosine" }))),
    h("tbody", null, results.map((r, i) => h("tr", { dataset: { tokenId: String(r.token_id) } },
      h("td", { class: "num", text: String(i + 1) }),
      h("td", { class: "tok" }, visibleToken(r.text, r.bytes_hex), h("span", { class: "tid", text: String(r.token_id) })),
      h("td", { class: "num", text: r.score.toFixed(4) }))))));
}

const kOf = (id) => Math.max(1, Math.min(50, Number($(id).value) || 10));

async function neighbours() {
  const box = $("neighbours-result");
  box.replaceChildren(placeholder("searching…"));
  try {
    const r = await api("POST", "/api/neighbours", { word: $("nb-word").value, k: kOf("nb-k") });
    box.replaceChildren(h("p", { class: "note" }, "Nearest to ", visibleToken(r.token.text), ` (token ${r.token.token_id}), by cosine:`),
      resultsTable(r.results), searched(r.requests));
  } catch (e) { failed(box, e); }
}

async function analogy() {
  const box = $("analogy-result");
  box.replaceChildren(placeholder("searching…"));
  try {
    const r = await api("POST", "/api/analogy", { a: $("an-a").value, b: $("an-b").value, c: $("an-c").value, k: kOf("an-k") });
    const t = (x) => visibleToken(r.tokens[x].text);
    box.replaceChildren(h("p", { class: "note" }, "One search for wte[", t("b"), "] − wte[", t("a"), "] + wte[", t("c"), "], the three excluded:"),
      resultsTable(r.results), searched(r.requests), analogySave(r));
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
    return [{ ...ev, data }, texts, `This analogy, saved with the token you selected at position ${ev.position} (its scores are what replay re-checks).`];
  };
  return h("div", { class: "actions save-row" }, saveButton(build, "Save this analogy as insight"));
}

// --- the map ---
const W = 360, H = 260, PAD = 28;

function scaler(all) {
  const xs = all.map((p) => p.x), ys = all.map((p) => p.y);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const sx = (W - 2 * PAD) / Math.max(x1 - x0, 1e-9), sy = (H - 2 * PAD) / Math.max(y1 - y0, 1e-9);
  return (p) => [PAD + (p.x - x0) * sx, H - PAD - (p.y - y0) * sy];
}

function mapSvg(r) {
  const at = scaler([...r.points, ...r.path]);
  const kids = [];
  if (r.path.length) {
    const pts = r.path.map((p) => at(p).map((v) => v.toFixed(1)).join(",")).join(" ");
    kids.push(svg("polyline", { class: "map-path", points: pts }));
    r.path.forEach((p, i) => {
      const [x, y] = at(p);
      kids.push(svg("g", { class: "map-step", dataset: { layer: String(p.layer) } },
        svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: i === r.path.length - 1 ? 5 : 3.5 }),
        svg("text", { x: (x + 6).toFixed(1), y: (y - 4).toFixed(1), text: String(p.layer) }),
        svg("title", { text: `the residual stream entering block ${p.layer}` + (p.layer === 0 ? " (the embedding)" : "") })));
    });
  }
  for (const p of r.points) {
    const [x, y] = at(p);
    kids.push(svg("g", { class: "map-point", dataset: { tokenId: String(p.token_id) } },
      svg("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 4 }),
      // Labels on the right half go to the left of their point, so none runs off the map.
      svg("text", { x: (x > W / 2 ? x - 6 : x + 6).toFixed(1), y: (y + 4).toFixed(1), "text-anchor": x > W / 2 ? "end" : "start",
                    text: p.label.replace(/ /g, "·") }),
      svg("title", { text: `token ${p.token_id}: ${JSON.stringify(p.label)}` })));
  }
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
    const r = await api("POST", "/api/map", { words, text_id: position === null ? null : S.textId, position });
    const ev = (r.explained || []).map((v) => (v * 100).toFixed(0) + "%").join(" and ");
    box.replaceChildren(mapSvg(r),
      h("p", { class: "note", text: `A projection onto the two main directions of the tokens shown (PCA${ev ? `, ${ev} of their spread` : ""}). ` +
        (r.path.length ? `The line is the vector of position ${position - 1} entering each block, numbered by layer: the path the model moved it along toward the token at ${position}.`
          : "Select a generated token and tick the box to see its path through the layers.") }),
      searched(r.requests));
  } catch (e) { failed(box, e); }
}

export function initEmbedding() {
  const submit = (id, fn) => $(id).addEventListener("submit", (e) => { e.preventDefault(); fn(); });
  submit("neighbours-form", neighbours);
  submit("analogy-form", analogy);
  submit("map-form", drawMap);
}
