// Lessons: guided experiments that chain the views (GET /api/lessons, POST /api/lessons/{id}/run;
// lens/lessons.py, one YAML file a lesson). Run on the learner's text, every step states a claim
// the server computed from the model in front of it, and says whether it holds there, and why
// not. A step opens its real view on that text (the candidates, the requests, the KV cache,
// attention, versus, a switch-off, the lens, patching, the contexts), and can be saved as an
// insight with its evidence. The lesson, its step and its last run are kept in this browser
// (localStorage): leave the page and come back to the same step.
import { generate } from "./actions.js";
import { api } from "./api.js";
import { switchOff } from "./ablate.js";
import { $, h, showError } from "./dom.js";
import { plural } from "./format.js";
import { lookInside } from "./inside.js";
import { saveButton } from "./insight.js";
import { openPatching } from "./patching.js";
import { S, render, select } from "./state.js";

const KEY = "puffergpt.lesson";
const SHOWN_EVIDENCE = 4000; // characters of a step's evidence shown as JSON

// {list, lesson (GET /api/lessons/{id}), run (the last run, on run.prompt), step, busy, opening}
const L = { list: [], lesson: null, run: null, step: 0, busy: false, opening: false };

function remember() {
  try {
    if (!L.lesson) localStorage.removeItem(KEY);
    else localStorage.setItem(KEY, JSON.stringify({ id: L.lesson.id, step: L.step, run: L.run }));
  } catch (_) { /* private mode, or too large: the lesson still works, it is not kept */ }
}

function recalled() {
  try { return JSON.parse(localStorage.getItem(KEY) || "null"); } catch (_) { return null; }
}

async function choose(id, kept = null) {
  try {
    L.lesson = await api("GET", `/api/lessons/${encodeURIComponent(id)}`);
  } catch (e) {
    showError(e);
    return;
  }
  L.run = kept && kept.run && kept.run.id === id ? kept.run : null;
  L.step = kept && L.run ? Math.min(Math.max(0, kept.step | 0), L.lesson.steps.length - 1) : 0;
  if (!$("prompt").value.trim() && !L.run) $("prompt").value = L.lesson.starter;
  remember();
  renderLessons();
}

async function runLesson() {
  if (!L.lesson || L.busy) return;
  const prompt = $("prompt").value;
  L.busy = true;
  renderLessons();
  try {
    L.run = await api("POST", `/api/lessons/${encodeURIComponent(L.lesson.id)}/run`, prompt.trim() ? { prompt } : {});
    L.step = 0;
    remember();
  } catch (e) {
    showError(e);
  } finally {
    L.busy = false;
    renderLessons();
  }
}

function go(step) {
  L.step = Math.min(Math.max(0, step), L.run.steps.length - 1);
  remember();
  renderLessons();
}

function leave() {
  L.lesson = null;
  L.run = null;
  remember();
  renderLessons();
}

// --- opening a step's view on the learner's text -------------------------------------------

// The lesson's prompt as the page's text, with at least n tokens generated greedily after it:
// the first generated position (its view is from the prompt's last token, as the lesson's).
async function textWith(prompt, n = 1) {
  const have = S.textId && S.prompt === prompt ? S.length - S.promptLen : 0;
  if (have < n) {
    $("prompt").value = prompt;
    await generate({ sampling: { max_tokens: n - Math.max(0, have), temperature: 0 } });
  }
  if (!S.textId || S.prompt !== prompt || S.length <= S.promptLen) throw new Error("the text could not be generated");
  select(S.promptLen);
  return S.promptLen;
}

const scrollTo = (id) => { const el = $(id); if (el) el.scrollIntoView({ block: "start" }); };

async function openView(step) {
  const run = L.run, ev = step.evidence || {};
  const p = ["contexts", "patching"].includes(step.view) ? null : await textWith(run.prompt, step.view === "kv" ? 2 : 1);
  switch (step.view) {
    case "candidates": scrollTo("candidates"); break;
    case "requests": scrollTo("waterfall"); break;
    case "kv": scrollTo("kv"); break;
    case "attention": case "lens": await lookInside(p); scrollTo(step.view); break;
    case "versus": await lookInside(p, { versus: ev.versus ? ev.versus.token_id : null }); scrollTo("versus"); break;
    case "ablate":
      await lookInside(p);
      if (ev.layer !== undefined) await switchOff(p, [`attn ${ev.layer}.${ev.head}`]);
      scrollTo("ablate");
      break;
    case "patching":
      scrollTo("patching-card");
      await openPatching({ clean: run.prompt, corrupt: ev.corrupt || run.prompt, answer: ev.answer && ev.answer.text,
        wrong: ev.wrong && ev.wrong.text, mode: "heads" });
      break;
    case "contexts": openContexts(run.prompt, ev); break;
    case "insight": await textWith(run.prompt, 1); document.querySelector("#lesson-step .save-insight").click(); break;
    default: break;
  }
}

function openContexts(prompt, ev) {
  const lines = prompt.split("\n").filter((x) => x.trim());
  if (ev.word) $("ctx-word").value = ev.word.text;
  ["ctx-p1", "ctx-p2", "ctx-p3"].forEach((id, i) => { $(id).value = lines[i] || ""; });
  scrollTo("contexts-card");
  $("contexts-form").requestSubmit();
}

async function open(step) {
  if (L.opening) return;
  L.opening = true;
  renderLessons();
  try {
    await openView(step);
  } catch (e) {
    showError(e);
  } finally {
    L.opening = false;
    renderLessons();
    render("controls");
  }
}

// --- saving a step ----------------------------------------------------------------------------

// The step as an insight: the candidates at the end of the lesson's prompt (what replay
// recomputes) and, as its data, the lesson, the step, its claim, verdict and evidence.
function stepEvidence(i) {
  if (!S.info) throw new Error("the model's details are still loading: try again in a moment");
  const run = L.run, st = run.steps[i];
  const ev = {
    kind: "candidates", model: S.info.model, prompt_ids: run.prompt_ids, position: run.prompt_ids.length,
    token_id: run.candidates[0].token_id, sampling: { temperature: 0, top_k: run.candidates.length, seed: null },
    candidates: run.candidates.map((c) => ({ token_id: c.token_id, logit: c.logit })),
    data: { lesson: { id: run.id, title: run.title, step: i + 1, step_title: st.title, claim: st.claim, holds: st.holds,
      evidence: st.evidence } },
  };
  return [ev, run.candidates.map((c) => [c.token_id, c.text]), `Step ${i + 1} of the lesson “${run.title}”: ${st.claim}`];
}

// --- drawing ------------------------------------------------------------------------------------

function listView() {
  return h("div", { class: "starters lesson-list", "aria-label": "Lessons" }, L.list.map((x) => h("button", {
    type: "button", class: "starter lesson-pick" + (L.lesson && L.lesson.id === x.id ? " on" : ""), dataset: { lesson: x.id },
    onclick: () => choose(x.id),
  }, h("span", { class: "starter-kind", text: plural(x.steps, "step") }), h("span", { class: "starter-text", text: x.title }))));
}

function evidenceView(ev) {
  const text = JSON.stringify(ev, (k, v) => (typeof v === "number" && !Number.isInteger(v) ? Number(v.toFixed(4)) : v), 1);
  return h("details", { class: "lesson-evidence" }, h("summary", { text: "The numbers (evidence)" }),
    h("pre", { text: text.length > SHOWN_EVIDENCE ? text.slice(0, SHOWN_EVIDENCE) + "\n…" : text }));
}

function stepView() {
  const run = L.run, i = L.step, st = run.steps[i], spec = L.lesson.steps[i] || {};
  const held = run.steps.filter((s) => s.holds).length;
  return h("div", { id: "lesson-step", class: "lesson-step", dataset: { step: String(i), holds: String(st.holds) } },
    h("p", { class: "lesson-where" }, `Step ${i + 1} of ${run.steps.length} · on `, h("code", { text: JSON.stringify(run.prompt) }),
      ` · ${held} of ${run.steps.length} claims hold here`),
    h("h3", { class: "lesson-title", text: st.title }),
    h("p", { class: "lesson-say", text: st.say || spec.say || "" }),
    h("div", { class: "lesson-claim " + (st.holds ? "holds" : "fails") },
      h("b", { class: "lesson-verdict", text: st.holds ? "Holds on your text: " : "Does not hold on your text: " }),
      h("span", { class: "lesson-claim-text", text: st.claim })),
    evidenceView(st.evidence),
    h("div", { class: "actions lesson-actions" },
      h("button", { type: "button", class: "primary lesson-open", disabled: L.opening || S.generating, onclick: () => open(st) },
        L.opening ? "opening…" : `Open the view (${st.view})`),
      saveButton(() => stepEvidence(i), "Save this step as insight")),
    h("div", { class: "actions lesson-nav" },
      h("button", { type: "button", class: "lesson-prev", disabled: i === 0, onclick: () => go(i - 1) }, "← Previous"),
      h("button", { type: "button", class: "lesson-next", disabled: i + 1 >= run.steps.length, onclick: () => go(i + 1) }, "Next →")));
}

export function renderLessons() {
  const box = $("lessons");
  if (!box) return;
  const kids = [listView()];
  if (L.lesson) {
    const ranOn = L.run ? L.run.prompt : null;
    kids.push(h("div", { class: "lesson-head" },
      h("h3", { class: "lesson-name", text: L.lesson.title }),
      h("p", { class: "note", text: L.lesson.summary }),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "primary lesson-run", disabled: L.busy, onclick: runLesson },
          L.busy ? "testing the claims…" : ranOn === null ? "Run the lesson on the prompt" : "Run again on the prompt"),
        h("button", { type: "button", class: "lesson-starter", onclick: () => { $("prompt").value = L.lesson.starter; } }, "Use its starter"),
        h("button", { type: "button", class: "lesson-leave", onclick: leave }, "Leave the lesson")),
      h("p", { class: "note", text: "The lesson runs on the text in the prompt box: change it to test the claims on your own." })));
    if (L.run && L.run.id === L.lesson.id) kids.push(stepView());
  }
  box.replaceChildren(...kids);
}

export function initLessons() {
  renderLessons();
  api("GET", "/api/lessons").then((list) => {
    L.list = list;
    const kept = recalled();
    if (kept && kept.id && list.some((x) => x.id === kept.id)) {
      if (kept.run && kept.run.prompt) $("prompt").value = kept.run.prompt;
      choose(kept.id, kept);
    } else renderLessons();
  }).catch(showError);
}
