// Switch parts off: the selected token's step run again with some heads and MLPs zeroed at
// every position (a head's mixed values before c_proj, an MLP's whole output), or set to their
// mean over the text's positions (mean ablation: one more prefill, with every part on, first),
// the tokens before it read again in one prefill on a copy (the text itself is untouched), then
// the top-k search. The candidates before and after, and whether the model's top choice changed.
// Every rerun is searches, counted in the waterfall with the view's extra requests.
import { api, textPath } from "./api.js";
import { clearAt, errorAt, failAt, h, visibleToken } from "./dom.js";
import { plural } from "./format.js";
import { saveButton, tokenEvidence, withData } from "./insight.js";
import { withText } from "./reopen.js";
import { S, insideKey, keepAblation, render } from "./state.js";

const K = 10; // candidates shown before and after
const picked = new Map(); // inside key -> Set of parts ("attn L.H", "mlp L") the learner switched off
let running = null; // the inside key being rerun
let mode = "zero"; // "zero": a part off writes nothing; "mean": it writes its mean over the text's positions

const partName = (part) => part.startsWith("attn ") ? `L${part.slice(5).replace(".", " H")}` : `L${part.slice(4)} MLP`;
const namesOf = (parts) => parts.map(partName).join(", ");

async function run(p, parts) {
  const key = insideKey(p);
  running = key;
  render("inside");
  try {
    const got = await withText(() => api("POST", textPath(S.textId, `/steps/${p}/ablate`), { parts, k: K, mode }));
    keepAblation(key, got);
    clearAt("ablate|" + key);
  } catch (e) {
    failAt("ablate|" + key, e); // by the button, not at the top of the page
  } finally {
    if (running === key) running = null;
    render("inside", "waterfall");
  }
}

function toggle(set, part, box, p, cfg) {
  if (set.has(part)) set.delete(part); else set.add(part);
  renderAblate(box, p, cfg);
}

function grid(set, box, p, cfg) {
  const busy = running !== null || S.generating;
  const cell = (part, label, title) => h("button", {
    type: "button", class: "ablate-part" + (set.has(part) ? " off" : ""), "aria-pressed": String(set.has(part)),
    dataset: { part }, title, disabled: busy, onclick: () => toggle(set, part, box, p, cfg) }, label);
  const rows = [];
  const columns = `2.1rem repeat(${cfg.n_head}, minmax(0, 1fr)) minmax(2.6rem, auto)`;
  for (let l = 0; l < cfg.n_layer; l++) {
    rows.push(h("div", { class: "ablate-row", dataset: { layer: String(l) }, style: { gridTemplateColumns: columns } },
      h("span", { class: "ablate-layer", text: `L${l}` }),
      Array.from({ length: cfg.n_head }, (_, hd) => cell(`attn ${l}.${hd}`, `H${hd}`, `switch off layer ${l}, head ${hd}`)),
      cell(`mlp ${l}`, "MLP", `switch off layer ${l}'s MLP (its output, bias included)`)));
  }
  return h("div", { class: "ablate-grid" }, rows);
}

function candidateList(title, list, chosenId, cls) {
  return h("div", { class: "ablate-list " + cls },
    h("h4", { text: title }),
    h("ol", null, list.map((c) => h("li", { class: c.token_id === chosenId ? "chosen" : null, dataset: { tokenId: String(c.token_id) } },
      visibleToken(c.text, c.bytes_hex), h("span", { class: "num", text: c.logit.toFixed(3) })))));
}

function result(got) {
  const b = got.top1_before, a = got.top1_after, chosen = got.chosen;
  const said = got.changed
    ? ["The model's top choice changes: ", visibleToken(b.text, b.bytes_hex), " becomes ", visibleToken(a.text, a.bytes_hex), "."]
    : ["The model's top choice stays ", visibleToken(a.text, a.bytes_hex), "."];
  const where = chosen === null ? "" : got.chosen_rank_after === null
    ? [" The token here, ", visibleToken(chosen.text, chosen.bytes_hex), `, is no longer among the ${got.after.length} best.`]
    : got.chosen_rank_after !== got.chosen_rank_before
      ? [" The token here, ", visibleToken(chosen.text, chosen.bytes_hex), `, is now rank ${got.chosen_rank_after + 1}.`] : "";
  return h("div", { class: "ablate-result", dataset: { changed: String(got.changed) } },
    h("p", { class: "ablate-says " + (got.changed ? "changed" : "same") }, h("b", { text: `With ${namesOf(got.parts)} off${got.mode === "mean" ? " (set to their means)" : ""}: ` }), said, where),
    h("div", { class: "ablate-lists" },
      candidateList("Before (all parts on)", got.before, chosen ? chosen.token_id : null, "before"),
      candidateList(`After (${plural(got.parts.length, "part")} off)`, got.after, chosen ? chosen.token_id : null, "after")),
    h("p", { class: "note", text: `This rerun cost ${plural(got.requests.length, "extra request")}: the ${plural(got.position, "token")} before position ${got.position} ` +
      (got.mode === "mean" ? "read once with every part on (for the parts' means) and again with those parts set to their means, in prefills of their own" : "read again with those parts off, in one prefill of their own") +
      " (your text and its keys are untouched), and the top-k search; listed in the waterfall." }),
    h("div", { class: "actions save-row" }, saveButton(() => [
      withData(tokenEvidence("ablation", got.position), { parts: got.parts, mode: got.mode || "zero", after: got.after.map((c) => ({ token_id: c.token_id, logit: c.logit })) }),
      got.after.map((c) => [c.token_id, c.text]),
      `The step at position ${got.position} run again with ${namesOf(got.parts)} off${got.mode === "mean" ? " (set to their means)" : ""}: replay runs it again and compares the candidates after.`,
    ], "Save this switch-off as insight")));
}

// Switch these parts off at p and run again (the notebook's Reopen of an ablation insight).
export function switchOff(p, parts, how = "zero") {
  picked.set(insideKey(p), new Set(parts));
  mode = how === "mean" ? "mean" : "zero";
  return run(p, [...parts].sort());
}

// Zero or mean ablation, for every rerun from here on.
function modeSwitch(box, p, cfg) {
  const button = (name, label, title) => h("button", { type: "button", class: "ablate-mode" + (mode === name ? " on" : ""),
    "aria-pressed": String(mode === name), dataset: { mode: name }, title, onclick: () => { mode = name; renderAblate(box, p, cfg); } }, label);
  return h("div", { class: "ablate-modes", role: "group", "aria-label": "what a part switched off writes" },
    h("span", { text: "Off means:" }),
    button("zero", "zero", "the part writes nothing"),
    button("mean", "its mean", "the part writes its mean over this text's positions, from a pass with every part on (one more prefill)"));
}

// The switch-off part of a token's inside view (position p), into `box`.
export function renderAblate(box, p, cfg) {
  if (!cfg) { box.replaceChildren(); return; }
  const key = insideKey(p);
  if (!picked.has(key)) picked.set(key, new Set());
  const set = picked.get(key);
  const parts = [...set].sort();
  const got = S.ablations.get(key);
  const go = h("button", { type: "button", class: "ablate-run", disabled: !parts.length || running !== null || S.generating,
    onclick: () => run(p, parts) }, parts.length ? `Run again with ${plural(parts.length, "part")} off` : "Pick parts to switch off");
  const clear = h("button", { type: "button", class: "ablate-clear", disabled: !parts.length || running !== null,
    onclick: () => { set.clear(); renderAblate(box, p, cfg); } }, "Switch all on");
  box.replaceChildren(
    h("h3", { text: "Switch parts off" }),
    h("p", { class: "note", text: "Test a cause: switch heads or MLPs off (click to toggle, several at once) and run this step again. " +
      "A head switched off mixes nothing (its values are zeroed before c_proj); an MLP switched off writes nothing (its output and bias zeroed); " +
      `both at every position. The tokens before position ${p} are read again that way on a copy, so it costs one prefill's requests, counted. ` +
      "“Its mean” puts each part's average output over this text's positions instead (mean ablation: a second prefill, with every part on, for the means): " +
      "it removes what the part says about this token in particular. Neither is always the gentler test. Zero writes nothing, a change the model never saw in training; " +
      "the mean writes an average of what the part wrote at every position, which can be far from anything it writes here, " +
      "so a mean can change the answer where zero does not (on the demo's copy starter, L1 H3 at its mean turns “ 3” into “ 7”; zeroed, it does not). Try both." }),
    modeSwitch(box, p, cfg),
    grid(set, box, p, cfg),
    h("div", { class: "actions" }, go, clear, running === key ? h("span", { class: "status", text: "running again…" }) : ""),
    errorAt("ablate|" + key),
    got ? result(got) : "");
}
