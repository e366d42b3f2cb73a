// The notebook panel: the insights saved (search by words and by tag), one opened
// with its words and evidence, Replay (the server recomputes the stored scores and
// says whether they still match), Reopen (a text back at that token, with the same
// sampling) and Push. Titles and bodies are the user's: text nodes only (dom.js).
import { generate, openPrompt, putTokenAt } from "./actions.js";
import { api, textPath } from "./api.js";
import { $, h, placeholder } from "./dom.js";
import { switchOff } from "./ablate.js";
import { lookInside } from "./inside.js";
import { readable, whenSaved } from "./insight.js";
import { S, insideKey, render, select, stepAt } from "./state.js";

const path = (id, rest = "") => `/api/insights/${encodeURIComponent(id)}${rest}`;
let off = false; // the server runs without a notebook

// --- token ids as text: from what the page holds, else from the server's tokenizer ---

// Every token text this page has seen: the text's tokens and each step's candidates.
function knownTokens() {
  const m = new Map();
  for (const t of S.tokens) m.set(t.id, { text: t.text, hex: t.hex });
  for (const step of S.memo.values()) {
    for (const c of step.candidates || []) if (!m.has(c.token_id)) m.set(c.token_id, { text: c.text, hex: c.bytes_hex || null });
  }
  return m;
}

// The ids the page has not seen, as text: one text opened from exactly those ids (no
// search: opening reads nothing) and closed again, a chunk of the context at a time.
async function lookUp(ids, into) {
  const want = [...new Set(ids)].filter((id) => !into.has(id));
  const n = S.info ? S.info.config.n_ctx : 256;
  for (let i = 0; i < want.length; i += n) {
    const t = await api("POST", "/api/texts", { prompt_ids: want.slice(i, i + n) });
    api("DELETE", textPath(t.id)).catch(() => {});
    for (const x of t.tokens) into.set(x.token_id, { text: x.text, hex: x.bytes_hex || null });
  }
  return into;
}

// Tokens joined as the text they make: bytes first, so a character split over two
// tokens comes out whole.
function joined(ids, known) {
  const bytes = [];
  const enc = new TextEncoder();
  for (const id of ids) {
    const t = known.get(id);
    if (!t) return null;
    if (t.hex) for (const b of t.hex.match(/[0-9a-f]{2}/gi) || []) bytes.push(parseInt(b, 16));
    else bytes.push(...enc.encode(t.text));
  }
  return new TextDecoder().decode(new Uint8Array(bytes));
}

function evidenceIds(ev) {
  const d = ev.data || {};
  return [ev.token_id, ...ev.candidates.slice(0, 10).map((c) => c.token_id), ...(d.ids || []),
    ...(d.after || []).map((c) => c.token_id), ...(d.versus ? [d.versus.token_id] : [])];
}

// The texts for the readable evidence: what the page knows now; with `ask`, the rest from the server.
async function evidenceTexts(ev, ask) {
  const known = knownTokens();
  const prompt = ev.prompt_ids.slice(0, ev.position);
  if (ask) {
    try { await lookUp([...prompt, ...evidenceIds(ev)], known); } catch (_) { /* the ids alone still say everything */ }
  }
  const token = new Map();
  for (const id of evidenceIds(ev)) if (known.has(id)) token.set(id, known.get(id).text);
  return { prompt: joined(prompt, known), token };
}

// --- the list ----------------------------------------------------------------------

const meta = (i) => [i.date.slice(0, 16).replace("T", " "), i.kind || "conversation", i.model || "no evidence", ...(i.tags || []).map((t) => "#" + t)].join(" · ");

function item(i) {
  return h("li", { class: "nb-item", dataset: { id: i.id } },
    h("button", { type: "button", class: "nb-open", onclick: () => openInsight(i.id) }, h("span", { class: "nb-title", text: i.title })),
    h("span", { class: "nb-meta", text: meta(i) }));
}

export async function refreshList() {
  const list = $("nb-list");
  const params = new URLSearchParams();
  if ($("nb-q").value.trim()) params.set("q", $("nb-q").value.trim());
  if ($("nb-tag").value.trim()) params.set("tag", $("nb-tag").value.trim());
  try {
    const query = params.toString();
    const r = await api("GET", "/api/insights" + (query ? "?" + query : ""));
    off = false;
    list.replaceChildren(...(r.insights.length ? r.insights.map(item)
      : [h("li", { class: "placeholder", text: query ? "No insight matches." : "No insights yet: use “Save as insight” on a token, a head, the lens or an analogy." })]));
  } catch (e) {
    off = /not found/i.test(e.message);
    list.replaceChildren(h("li", { class: off ? "placeholder" : "emb-error", text: off
      ? "This server runs without a notebook: start it with `puffergpt serve --notebook DIR` to save insights."
      : e.message }));
  }
}

// --- one insight -------------------------------------------------------------------

async function openInsight(id) {
  const box = $("nb-detail");
  box.replaceChildren(placeholder("opening…"));
  let ins;
  try { ins = await api("GET", path(id)); } catch (e) { box.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message })); return; }
  const ev = ins.evidence;
  if (!ev) { showWords(box, ins); return; }
  const evidence = h("pre", { class: "insight-evidence nb-evidence", text: readable(ev, await evidenceTexts(ev, false)) });
  const out = h("div", { class: "nb-result", role: "status" });
  const replayButton = h("button", { type: "button", class: "nb-replay", onclick: () => replay(ins, out, replayButton) }, "Replay");
  const reopenButton = h("button", { type: "button", class: "nb-reopen", onclick: () => reopen(ins, out, reopenButton) }, "Reopen at this token");
  box.replaceChildren(
    h("h3", { class: "nb-detail-title", text: ins.title }),
    h("p", { class: "nb-meta", text: meta({ ...ins, kind: ev.kind }) }),
    h("p", { class: "nb-file" }, "File ", h("code", { text: ins.path }), ", commit ", h("code", { text: ins.commit ? ins.commit.slice(0, 12) : "not committed yet" })),
    ins.body ? h("p", { class: "nb-body", text: ins.body }) : h("p", { class: "placeholder", text: "(no words)" }),
    h("h4", { text: "Evidence" }), evidence,
    h("div", { class: "actions" }, replayButton, reopenButton), out);
  box.dataset.id = ins.id;
  const texts = await evidenceTexts(ev, true);
  if (box.dataset.id === ins.id) evidence.textContent = readable(ev, texts);
}

// An insight saved from a conversation: its words, and plainly no evidence to replay.
function showWords(box, ins) {
  box.replaceChildren(
    h("h3", { class: "nb-detail-title", text: ins.title }),
    h("p", { class: "nb-meta", text: meta({ ...ins, kind: null, model: null }) }),
    h("p", { class: "nb-file" }, "File ", h("code", { text: ins.path }), ", commit ", h("code", { text: ins.commit ? ins.commit.slice(0, 12) : "not committed yet" })),
    ins.body ? h("p", { class: "nb-body", text: ins.body }) : h("p", { class: "placeholder", text: "(no words)" }),
    h("h4", { text: "Evidence" }), h("p", { class: "placeholder nb-no-evidence", text: "no evidence (saved from a conversation): nothing to replay" }));
  box.dataset.id = ins.id;
}

const sci = (x) => (x === null || x === undefined ? "–" : x === 0 ? "0" : x.toExponential(2));

async function replay(ins, out, button) {
  button.disabled = true;
  out.replaceChildren(placeholder("replaying: recomputing the scores…"));
  try {
    const r = await api("POST", path(ins.id, "/replay"));
    const n = ins.evidence.candidates.length;
    const verdict = r.candidates_match ?? r.matches
      ? `The scores still match: the same ${n} token ids in the same order (same ids: yes), max abs diff ${sci(r.max_abs_diff)} (tolerance ${r.tolerance}).`
      : `The scores no longer match: same ids: ${r.same_ids ? "yes" : "no"}, max abs diff ${sci(r.max_abs_diff)} (tolerance ${r.tolerance})` +
        (r.missing ? `, ${r.missing} stored candidates not among them now` : "") + ".";
    const diffs = (r.first_differences || []).map((d) => h("li", { text:
      `rank ${d.rank + 1}: stored token ${d.stored.token_id} (${d.stored.logit.toFixed(4)}), now token ${d.now.token_id} (${d.now.logit.toFixed(4)})` +
      (d.diff === null ? "" : `, diff ${sci(d.diff)}`) }));
    out.replaceChildren(h("p", { class: "nb-verdict " + (r.matches ? "ok" : "bad"), dataset: { matches: String(r.matches) }, text: verdict }),
      diffs.length ? h("ul", { class: "nb-diffs" }, diffs) : "", ...dataVerdict(r.data, ins.evidence));
  } catch (e) {
    out.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message }));
  } finally { button.disabled = false; }
}

const KIND_DATA = { attention: "head's weights", lens: "lens layer", analogy: "analogy", attribution: "attribution (each part)", ablation: "rerun with parts off" };

// What replay said of the data the insight holds beyond its candidates: each item that differs, by how much.
function dataVerdict(d, ev) {
  if (!d) {
    return ev.data && KIND_DATA[ev.kind] ? [h("p", { class: "nb-data-verdict note", text: "This insight's data lacks what replay recomputes: only its candidates were re-checked." })] : [];
  }
  const tol = d.weight_tolerance ?? d.tolerance;
  const say = d.matches
    ? `Its ${KIND_DATA[d.kind]} still matches too: ${d.checked} items recomputed, max abs diff ${sci(d.max_abs_diff)} (tolerance ${tol}).`
    : `Its ${KIND_DATA[d.kind]} no longer matches: ${d.differing} of ${d.checked} items differ, max abs diff ${sci(d.max_abs_diff)} (tolerance ${tol}).`;
  const show = (x) => (x === null || x === undefined ? "missing" : typeof x === "object" ? `token ${x.token_id} (${x.value === null ? "–" : x.value.toFixed(6)})` : typeof x === "number" ? x.toFixed(6) : String(x));
  return [h("p", { class: "nb-data-verdict nb-verdict " + (d.matches ? "ok" : "bad"), dataset: { matches: String(d.matches) }, text: say }),
    d.differences.length ? h("ul", { class: "nb-data-diffs" }, d.differences.map((x) => h("li", { text:
      `${x.item}: stored ${show(x.stored)}, now ${show(x.now)}` + (x.diff === null ? "" : `, diff ${sci(x.diff)}`) }))) : ""];
}

function setSampling(s) {
  const temp = $("temperature");
  temp.value = String(s.temperature);
  temp.dispatchEvent(new Event("input"));
  $("top-k").value = String(s.top_k);
  $("seed").value = s.seed === null ? "" : String(s.seed);
  // the controls it recorded (format 4), the others back at "none"
  $("frequency-penalty").value = String(s.frequency_penalty ?? 0);
  $("presence-penalty").value = String(s.presence_penalty ?? 0);
  $("repetition-penalty").value = String(s.repetition_penalty ?? 1);
  $("min-p").value = String(s.min_p ?? 0);
  $("logit-bias").value = Object.entries(s.logit_bias || {}).map(([t, b]) => `${t}=${b}`).join(", ");
}

// Where a seeded, sampled token's generation began (the page records it with the
// evidence): the server draws a generation's tokens from one seeded stream, so only the
// same generation, from its start, draws the same tokens again.
function generationOf(ev) {
  const g = ev.data && ev.data.generation;
  const sampled = ev.sampling.seed !== null && ev.sampling.temperature > 0;
  if (!sampled || !g || !Number.isInteger(g.start) || g.start < 1 || g.start > ev.position) return null;
  const n = ev.position - g.start + 1;
  return S.info && n > S.info.max_new_tokens ? null : { start: g.start, n };
}

const same = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

// A new text of exactly these ids, checked; the positions of them the insight says the model
// generated are reopened as generated (its penalties count their tokens, as when it was saved).
async function openIds(ids, ev) {
  const gen = (ev.generated || []).filter((q) => q < ids.length);
  const reopen = gen.length ? { length: ids.length, generated: gen.map((q) => ({ position: q, temperature: ev.sampling.temperature })) } : null;
  await openPrompt(joined(ids, await lookUp(ids, knownTokens())) ?? "", ids, reopen);
  if (!same(S.tokens.map((t) => t.id), ids)) throw new Error("the server opened other tokens than the recorded ones");
}

// The insight's sampling for a generation of n tokens, with the controls it recorded (format 4).
const sampling = (ev, n) => ({ ...ev.sampling, max_tokens: n });
const textOf = (id) => { const t = knownTokens().get(id); return t ? ` (${JSON.stringify(t.text)})` : ""; };

// The insight's text, back at its token. A seeded sampled token is drawn again: its
// generation rerun from where it began, with its seed, gives the recorded tokens. A
// greedy token is generated again. Otherwise (no seed, an insight that does not say where
// its generation began, or a rerun that drew otherwise) the text is opened just before
// the token, one token generated for its candidates, and the recorded token put back.
async function reopen(ins, out, button) {
  const ev = ins.evidence;
  const say = [];
  const show = (cls = "") => out.replaceChildren(...say.map((s) => h("p", { class: "nb-reopened " + cls, text: s })));
  if (S.generating || S.busy) { out.replaceChildren(h("p", { class: "emb-error", text: "Wait for the current generation or edit to end." })); return; }
  if (S.info && ev.model !== S.info.model) {
    out.replaceChildren(h("p", { class: "emb-error", text: `This insight was saved from model ${ev.model}; this server runs ${S.info.model}: start it with that model to reopen it.` }));
    return;
  }
  button.disabled = true;
  const p = ev.position;
  try {
    setSampling(ev.sampling);
    const done = await rerun(ev, generationOf(ev), say) || await atToken(ev, say);
    if (!done) throw new Error("the token at this position could not be generated (see the error above)");
    select(p);
    say.push(compareNow(ev, stepAt(p)));
    show();
    const back = await restoreView(ev);
    if (back) { say.push(back); show(); }
  } catch (e) {
    say.push(e.message);
    show("emb-error");
  } finally { button.disabled = false; }
}

// The seeded generation again from its start: true when it drew the recorded tokens.
async function rerun(ev, gen, say) {
  if (!gen) return false;
  const ids = ev.prompt_ids.slice(0, gen.start);
  await openIds(ids, ev);
  say.push(`Opened a new text of the ${ids.length} tokens the model had read when this generation began, the recorded token ids.`);
  await generate({ keepText: true, sampling: sampling(ev, gen.n) });
  const want = [...ev.prompt_ids.slice(gen.start, ev.position), ev.token_id];
  if (same(S.tokens.slice(gen.start, ev.position + 1).map((t) => t.id), want) && S.length === ev.position + 1) {
    say.push(`Generated again from position ${gen.start} with seed ${ev.sampling.seed}: the same ${gen.n === 1 ? "token" : `${gen.n} tokens`} as recorded.`);
    return true;
  }
  say.push(`The same seed drew other tokens this time (the scores may differ in their last digits), so the text is opened at the token instead.`);
  return false;
}

// Open just before the token, generate one, and put the recorded token there if another came.
async function atToken(ev, say) {
  const p = ev.position;
  const ids = ev.prompt_ids.slice(0, p);
  await openIds(ids, ev);
  say.push(`Opened a new text of the ${ids.length} tokens the model had read, the recorded token ids.`);
  await generate({ keepText: true, sampling: sampling(ev, 1) });
  if (!S.tokens[p]) return false;
  if (S.tokens[p].id === ev.token_id) return true;
  const why = ev.sampling.temperature === 0 ? "At T = 0 the best candidate is now another token"
    : ev.sampling.seed === null ? "It was sampled without a seed, so this draw is a new one"
    : "This insight does not say where its generation began, and a seeded generation draws its tokens in turn, so this draw is not the recorded one";
  say.push(`${why}: token ${S.tokens[p].id}${textOf(S.tokens[p].id)} came at position ${p}; the recorded token ${ev.token_id}${textOf(ev.token_id)} was put back.`);
  await putTokenAt(p, ev.token_id);
  return true;
}

// The view the insight was saved from, back: Look inside at its token with the head opened,
// the lens layer picked, the comparison token, the parts switched off; or the analogy asked
// again. -> what was brought back, in words (null for a token's candidates: the panel shows them).
async function restoreView(ev) {
  const d = ev.data || {};
  const p = ev.position;
  if (ev.kind === "analogy" && Array.isArray(d.terms)) {
    ["a", "b", "c"].forEach((x, i) => { $(`an-${x}`).value = d.terms[i]; });
    if (Array.isArray(d.ids)) $("an-k").value = String(d.ids.length);
    $("analogy-form").requestSubmit();
    $("analogy-result").scrollIntoView({ block: "nearest" });
    return `The analogy ${d.terms.map((t) => JSON.stringify(t)).join(" : ")} asked again in the embedding panel.`;
  }
  if (!["attention", "lens", "attribution", "ablation"].includes(ev.kind)) return null;
  await lookInside(p, { versus: d.versus ? d.versus.token_id : null });
  const view = S.inside.get(insideKey(p));
  if (!view) return null;
  let what = `Look inside at position ${p}`;
  if (ev.kind === "attention" && Number.isInteger(d.layer)) { view.openHead = [d.layer, d.head]; what += `, layer ${d.layer} head ${d.head} opened`; }
  if (ev.kind === "lens" && Number.isInteger(d.layer)) { view.lensLayer = d.layer; what += `, the lens at layer ${d.layer}`; }
  if (ev.kind === "attribution" && d.versus) what += `, what each part adds and why not token ${d.versus.token_id}`;
  render("inside");
  if (ev.kind === "ablation" && Array.isArray(d.parts) && d.parts.length) {
    await switchOff(p, d.parts, d.mode);
    what += `, run again with ${d.parts.join(", ")} off`;
  }
  const box = { attention: ".attn-head", lens: "#lens", attribution: "#attribution", ablation: "#ablate" }[ev.kind];
  const el = document.querySelector(box);
  if (el) el.scrollIntoView({ block: "nearest" });
  return `The view it was saved from, back: ${what}.`;
}

// The reopened step's candidates against the stored ones (the same comparison as replay).
function compareNow(ev, step) {
  if (!step) return "The reopened token has no candidates to compare.";
  const now = new Map(step.candidates.map((c) => [c.token_id, c.logit]));
  const n = Math.min(ev.candidates.length, step.candidates.length);
  const sameIds = ev.candidates.slice(0, n).every((c, i) => step.candidates[i].token_id === c.token_id);
  const diffs = ev.candidates.filter((c) => now.has(c.token_id)).map((c) => Math.abs(c.logit - now.get(c.token_id)));
  return `Back at position ${ev.position}: its top ${n} candidates ${sameIds ? "have the same ids" : "have other ids"} as recorded, ` +
    `max abs diff ${sci(diffs.length ? Math.max(...diffs) : null)}.`;
}

async function push() {
  const out = $("nb-push-result");
  const button = $("nb-push");
  button.disabled = true;
  out.replaceChildren(placeholder("pushing…"));
  try {
    const r = await api("POST", "/api/insights/push");
    out.replaceChildren(h("p", { class: "insight-saved", text: `Pushed ${r.branch} to ${r.remote} (commit ${r.commit.slice(0, 12)}).` }));
  } catch (e) {
    out.replaceChildren(h("p", { class: "emb-error", role: "alert" }, h("strong", { text: "The push failed: " }), e.message));
  } finally { button.disabled = false; }
}

export function initNotebook() {
  $("nb-search").addEventListener("submit", (e) => { e.preventDefault(); refreshList(); });
  $("nb-push").addEventListener("click", push);
  whenSaved(() => refreshList());
  refreshList();
}
