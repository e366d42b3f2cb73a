// The header: which model is loaded and what it is (for the demo: how to get GPT-2
// small), the model's figures, and the starter prompts chosen for this model.
import { generate } from "./actions.js";
import { apiKey, setApiKey } from "./api.js";
import { $, h } from "./dom.js";
import { baseName, int } from "./format.js";

// Used only when the server names no starters of its own.
const DEFAULT_STARTERS = [
  { kind: "Recall a fact", prompt: "The capital of France is" },
  { kind: "Copy a repetition", prompt: "one two three one two three one two" },
  { kind: "Continue a count", prompt: "1, 2, 3, 4, 5," },
];

function renderFigures(info) {
  const c = info.config;
  const items = [
    ["model", baseName(info.model)],
    ["layers", int(c.n_layer)],
    ["width", int(c.n_embd)],
    ["heads", int(c.n_head)],
    ["context", int(c.n_ctx)],
    ["vocabulary", int(c.n_vocab)],
    ["documents", int(info.documents)],
    ["in the store", info.megabytes + " MB"],
    ["requests/token", int(info.requests_per_token)],
    ["round trips/token", int(info.round_trips_per_token)],
    ["search", `${String(info.metric).replace(/_/g, " ")} · ${info.backend}`],
  ];
  $("info").replaceChildren(...items.map(([k, v]) => h("span", { class: "info-item" }, h("span", { class: "k", text: k }), h("span", { class: "v", text: v }))));
}

function renderAbout(info) {
  const a = info.about || { name: baseName(info.model), description: "", is_demo: false, how_to_get_gpt2: null };
  const kids = [h("p", { class: "about-name" }, "Loaded: ", h("b", { text: a.name }), a.is_demo ? h("span", { class: "badge b-demo", text: "demo model" }) : "")];
  if (a.description) kids.push(h("p", { class: "about-desc", text: a.description }));
  if (a.how_to_get_gpt2) kids.push(h("p", { class: "about-get" }, "For GPT-2 small: ", h("code", { text: a.how_to_get_gpt2 })));
  if (info.fallback) kids.push(h("p", { class: "about-fallback", role: "status", text: info.fallback }));
  const box = $("about");
  box.replaceChildren(...kids);
  box.classList.toggle("demo", !!a.is_demo);
}

// On a phone the text is a screen or more below the starters: a tapped starter brings it
// into view, where its tokens are about to stream in (a wide screen shows it already).
function revealText() {
  const card = $("tokens").closest("section");
  const top = card.getBoundingClientRect().top;
  if (top < 0 || top > window.innerHeight * 0.6) card.scrollIntoView({ block: "start" });
}

// A starter that teaches a control sets the page's sampling to it (the penalties open) and the
// others back to none, so the lesson is the control alone.
const CONTROL_INPUTS = { temperature: "temperature", top_k: "top-k", frequency_penalty: "frequency-penalty",
  presence_penalty: "presence-penalty", repetition_penalty: "repetition-penalty", min_p: "min-p" };
const NONE = { frequency_penalty: 0, presence_penalty: 0, repetition_penalty: 1, min_p: 0 };
function setControls(sampling) {
  if (!sampling) return;
  for (const [k, v] of Object.entries({ ...NONE, ...sampling })) {
    const input = $(CONTROL_INPUTS[k]);
    if (!input) continue;
    input.value = String(v);
    input.dispatchEvent(new Event("input"));
  }
  $("logit-bias").value = "";
  $("penalties").open = Object.keys(sampling).some((k) => k in NONE);
}

function renderStarters(info) {
  const starters = info && Array.isArray(info.starters) && info.starters.length ? info.starters : DEFAULT_STARTERS;
  $("starters").replaceChildren(...starters.map((s) => h("button", {
    type: "button", class: "starter", dataset: { prompt: s.prompt }, title: s.prompt,
    onclick: () => { $("prompt").value = s.prompt; setControls(s.sampling); revealText(); generate(); },
  }, h("span", { class: "starter-kind", text: s.kind }), h("span", { class: "starter-text", text: s.prompt }))));
}

// The embedding panel starts from words this model trained (the server names them per
// model: an untrained row ties with every other one and would teach nothing).
function embeddingWords(info) {
  const w = info.embedding_words;
  if (!w) return;
  const set = (id, v) => { $(id).value = v; };
  if (typeof w.neighbours === "string") set("nb-word", w.neighbours);
  if (Array.isArray(w.analogy) && w.analogy.length === 3) {
    set("an-a", w.analogy[0]); set("an-b", w.analogy[1]); set("an-c", w.analogy[2]);
  }
  if (Array.isArray(w.map)) set("map-words", w.map.join("\n"));
}

// A server started with --api-key: the field for its key, which stays in this browser
// (localStorage) and goes with every request as a Bearer token.
function renderKeyField(info) {
  const form = $("key-form");
  if (!form || !(info.auth && info.auth.api_key)) return;
  const input = $("api-key");
  input.value = apiKey();
  input.addEventListener("change", () => setApiKey(input.value.trim()));
  form.addEventListener("submit", (e) => { e.preventDefault(); setApiKey(input.value.trim()); });
  form.hidden = false;
}

export function renderInfo(info) {
  renderKeyField(info);
  embeddingWords(info);
  renderFigures(info);
  renderAbout(info);
  renderStarters(info);
}
export { renderStarters };
