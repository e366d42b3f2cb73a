// Why this token and not that one: the parts of logit(chosen) − logit(other), each the
// chosen token's part minus the other's (the same parts as "what each part adds", read
// against wte[chosen] − wte[other]), so they sum to the difference of the two logits. The
// other token is the runner-up unless the learner clicks another candidate: the server
// computes it (GET …/inspect?versus=ID: one fetch and one search a layer, counted).
import { h, visibleToken } from "./dom.js";
import { plural } from "./format.js";
import { partsChart, signed } from "./attribution.js";

const tokenOf = (t) => t.token || { text: t.text ?? `#${t.token_id}`, bytes_hex: t.bytes_hex };

// The final candidates (the lens's last row), the chosen token left out: what can be asked.
function candidates(view, chosenId) {
  const last = view.lens && view.lens[view.lens.length - 1];
  const top = last ? (Array.isArray(last) ? last : last.top) : [];
  return top.filter((t) => t.token_id !== chosenId);
}

function picker(view, v, chosenId, pick, busy) {
  return h("div", { class: "versus-pick", role: "group", "aria-label": "compare with a candidate" },
    h("span", { class: "versus-pick-label", text: "Compare with:" }),
    candidates(view, chosenId).map((t) => h("button", {
      type: "button", class: "lens-chip versus-chip" + (t.token_id === v.token_id ? " chosen" : ""),
      "aria-pressed": String(t.token_id === v.token_id), disabled: busy || t.token_id === v.token_id,
      dataset: { tokenId: String(t.token_id) }, title: `why not this one? token id ${t.token_id} · logit ${t.logit.toFixed(3)}`,
      onclick: () => pick(t.token_id),
    }, visibleToken(t.text ?? `#${t.token_id}`, t.bytes_hex))));
}

// The versus part of a token's inside view, into `box`; pick(id) asks the server for
// another comparison (busy while it does).
export function renderVersus(box, view, openHead, pick, busy) {
  const a = view.attribution;
  const v = a && a.versus;
  if (!v || !v.parts || !v.parts.length) { box.replaceChildren(); return; }
  const c = tokenOf(a), o = tokenOf(v);
  const diff = a.logit - v.logit;
  const sum = v.parts.reduce((s, p) => s + p.value, 0);
  const sorted = [...v.parts].sort((x, y) => y.value - x.value);
  const say = (p) => `${p.label} (${signed(p.value)})`;
  const best = sorted.filter((p) => p.value > 0).slice(0, 2), worst = sorted.filter((p) => p.value < 0).reverse().slice(0, 2);
  box.replaceChildren(
    h("h3", null, "Why ", visibleToken(c.text, c.bytes_hex), " and not ", visibleToken(o.text, o.bytes_hex), "?"),
    h("p", { class: "note" }, "The same parts, each read against the difference of the two tokens' vectors: a part's bar is what it adds to ",
      visibleToken(c.text, c.bytes_hex), " minus what it adds to ", visibleToken(o.text, o.bytes_hex),
      ". A part that lifts both alike (every digit, say) comes out near zero here; what is left is what tells them apart. " +
      "Click another candidate to compare with it (one fetch and a search a layer, counted in the waterfall)."),
    picker(view, v, a.token_id, pick, busy),
    h("p", { class: "versus-says" },
      best.length ? `For it most: ${best.map(say).join(", ")}. ` : "",
      worst.length ? `Against it most: ${worst.map(say).join(", ")}.` : ""),
    ...partsChart(v.parts, openHead),
    h("p", { class: "note versus-sum" }, `The ${plural(v.parts.length, "part")} sum to `, h("b", { class: "sum", text: sum.toFixed(4) }),
      "; the difference is ", h("b", { class: "diff", text: diff.toFixed(4) }), ` (${a.logit.toFixed(4)} − ${v.logit.toFixed(4)}).`));
}
