// The notebook panel: the insights saved (search by words and by tag), one opened
// with its words and evidence, Replay (the server recomputes the stored scores and
// says whether they still match), Reopen (a text back at that token, with the same
// sampling) and Push. Titles and bodies are the user's: text nodes only (dom.js).
import { generate, openPrompt, putTokenAt } from "./actions.js";
import { api } from "./api.js";
import { $, h, placeholder } from "./dom.js";
import { readable, whenSaved } from "./insight.js";
import { S, select, stepAt } from "./state.js";

const path = (id, rest = "") => `/api/insights/${encodeURIComponent(id)}${rest}`;
const DECODE_BATCH = 16; // prompts a /v1/completions request takes (its MAX_CHOICES)
const DECODED_IDS = 64; // token texts looked up for the readable evidence
let off = false; // the server runs without a notebook

// --- token ids as text, through the OpenAI-compatible API: echo, no new token, no search ---

async function decode(prompt) {
  const r = await api("POST", "/v1/completions", { prompt, max_tokens: 0, echo: true });
  return [...r.choices].sort((a, b) => a.index - b.index).map((c) => c.text);
}
const decodeIds = async (ids) => (await decode(ids))[0];

async function tokenTexts(ids) {
  const out = new Map();
  const want = [...new Set(ids)].slice(0, DECODED_IDS);
  for (let i = 0; i < want.length; i += DECODE_BATCH) {
    const part = want.slice(i, i + DECODE_BATCH);
    const texts = await decode(part.map((id) => [id]));
    part.forEach((id, j) => out.set(id, texts[j]));
  }
  return out;
}

async function evidenceTexts(ev) {
  const ids = [ev.token_id, ...ev.candidates.slice(0, 10).map((c) => c.token_id), ...((ev.data && ev.data.ids) || [])];
  try {
    return { prompt: await decodeIds(ev.prompt_ids.slice(0, ev.position)), token: await tokenTexts(ids) };
  } catch (_) { // the ids alone still say everything
    return { prompt: null, token: new Map() };
  }
}

// --- the list ----------------------------------------------------------------------

const meta = (i) => [i.date.slice(0, 16).replace("T", " "), i.kind, i.model, ...(i.tags || []).map((t) => "#" + t)].join(" · ");

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
  const evidence = h("pre", { class: "insight-evidence nb-evidence", text: readable(ev, { prompt: null, token: new Map() }) });
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
  evidence.textContent = readable(ev, await evidenceTexts(ev));
}

const sci = (x) => (x === null || x === undefined ? "–" : x === 0 ? "0" : x.toExponential(2));

async function replay(ins, out, button) {
  button.disabled = true;
  out.replaceChildren(placeholder("replaying: recomputing the scores…"));
  try {
    const r = await api("POST", path(ins.id, "/replay"));
    const n = ins.evidence.candidates.length;
    const verdict = r.matches
      ? `The scores still match: the same ${n} token ids in the same order (same ids: yes), max abs diff ${sci(r.max_abs_diff)} (tolerance ${r.tolerance}).`
      : `The scores no longer match: same ids: ${r.same_ids ? "yes" : "no"}, max abs diff ${sci(r.max_abs_diff)} (tolerance ${r.tolerance})` +
        (r.missing ? `, ${r.missing} stored candidates not among them now` : "") + ".";
    const diffs = (r.first_differences || []).map((d) => h("li", { text:
      `rank ${d.rank + 1}: stored token ${d.stored.token_id} (${d.stored.logit.toFixed(4)}), now token ${d.now.token_id} (${d.now.logit.toFixed(4)})` +
      (d.diff === null ? "" : `, diff ${sci(d.diff)}`) }));
    out.replaceChildren(h("p", { class: "nb-verdict " + (r.matches ? "ok" : "bad"), dataset: { matches: String(r.matches) }, text: verdict }),
      diffs.length ? h("ul", { class: "nb-diffs" }, diffs) : "");
  } catch (e) {
    out.replaceChildren(h("p", { class: "emb-error", role: "alert", text: e.message }));
  } finally { button.disabled = false; }
}

function setSampling(s) {
  const temp = $("temperature");
  temp.value = String(s.temperature);
  temp.dispatchEvent(new Event("input"));
  $("top-k").value = String(s.top_k);
  $("seed").value = s.seed === null ? "" : String(s.seed);
}

// The insight's text, back at its token: a new text of exactly prompt_ids[:position],
// one token generated with the insight's sampling, and the recorded token put there
// when sampling chose another. Says what it did and whether the scores match.
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
  const ids = ev.prompt_ids.slice(0, ev.position);
  try {
    await openPrompt(await decodeIds(ids), ids);
    const got = S.tokens.map((t) => t.id);
    if (got.length !== ids.length || got.some((x, i) => x !== ids[i])) throw new Error("the server opened other tokens than the recorded ones");
    say.push(`Opened a new text of the ${ids.length} tokens the model had read, the recorded token ids.`);
    setSampling(ev.sampling);
    await generate({ keepText: true, sampling: { max_tokens: 1, temperature: ev.sampling.temperature, top_k: ev.sampling.top_k, seed: ev.sampling.seed } });
    const p = ev.position;
    if (!S.tokens[p]) throw new Error("the token at this position could not be generated (see the error above)");
    if (S.tokens[p].id !== ev.token_id) {
      say.push(`Sampling chose token ${S.tokens[p].id} this time; the recorded token ${ev.token_id} was put back at position ${p}.`);
      await putTokenAt(p, ev.token_id);
    }
    select(p);
    say.push(compareNow(ev, stepAt(p)));
    show();
  } catch (e) {
    say.push(e.message);
    show("emb-error");
  } finally { button.disabled = false; }
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
