// puffergpt's pages: plain ES modules, no framework, no network but this server's
// API. One module a panel; this one wires them up.
import { generate, stop, stepBack, stepForward, cut } from "./actions.js";
import { api, textPath, withKey } from "./api.js";
import { $, showError } from "./dom.js";
import { initCandidates, updateProbs } from "./candidates.js";
import { initCompare } from "./compare.js";
import { initContexts, renderContextStarters } from "./contexts.js";
import { initEmbedding } from "./embedding.js";
import { initHow } from "./how.js";
import { renderInfo, renderStarters } from "./info.js";
import { initInside } from "./inside.js";
import { initInsightForm } from "./insight.js";
import { initKv } from "./kvcache.js";
import { initLessons } from "./lessons.js";
import { initNotebook } from "./notebook.js";
import { initOutputSearch } from "./outputsearch.js";
import { initPatching } from "./patching.js";
import { initPhases } from "./phases.js";
import { S, renderAll, view } from "./state.js";
import { initTokens } from "./tokens.js";
import { initTree } from "./tree.js";
import { initWaterfall } from "./waterfall.js";

function renderControls() {
  const running = S.generating || S.busy;
  $("generate").disabled = running;
  $("stop").disabled = !S.generating;
  $("step-back").disabled = running || !S.textId || S.length <= 1;
  $("step-forward").disabled = running || !S.textId || S.length >= S.tokens.length;
  $("cut").disabled = running || !S.textId || S.selected === null || S.selected < 1 || S.selected >= S.length;
  document.querySelectorAll("#candidates .branch").forEach((b) => { b.disabled = running || b.closest("tr").classList.contains("chosen"); });
  document.querySelectorAll("#tree .tree-node").forEach((b) => { b.disabled = running; });
  const look = $("look-inside");
  if (look) look.disabled = running;
}

function initControls() {
  const temp = $("temperature");
  const showTemp = () => { $("temperature-value").textContent = Number(temp.value).toFixed(2); };
  temp.addEventListener("input", () => { showTemp(); updateProbs(); });
  showTemp();
  $("generate").addEventListener("click", () => generate());
  $("stop").addEventListener("click", stop);
  $("step-back").addEventListener("click", stepBack);
  $("step-forward").addEventListener("click", stepForward);
  $("cut").addEventListener("click", cut);
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); generate(); }
  });
  window.addEventListener("beforeunload", () => {
    // Close the text so the server drops its keys.
    if (S.textId) fetch(textPath(S.textId), { method: "DELETE", keepalive: true, headers: withKey() }).catch(() => {});
  });
}

function initPlayground() {
  // The order views are drawn in; controls last, once every button exists.
  initTokens();
  initCandidates();
  initInside();
  initWaterfall();
  initKv();
  initPhases();
  initTree();
  view("controls", renderControls);
  initControls();
  initCompare();
  initOutputSearch();
  initEmbedding();
  initContexts();
  initPatching();
  initInsightForm();
  initNotebook();
  initLessons();
  renderStarters(null);
  api("GET", "/api/info").then((info) => {
    S.info = info;
    renderInfo(info);
    renderContextStarters(info);
    $("max-tokens").max = String(info.max_new_tokens);
    $("top-k").max = String(info.config.n_vocab);
    renderAll();
  }).catch((e) => {
    $("info").textContent = "The model's details could not be loaded.";
    showError(e);
  });
  renderAll();
}

const page = document.body.dataset.page;
if (page === "playground") initPlayground();
else if (page === "how") initHow();
