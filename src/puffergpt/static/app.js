// puffergpt playground: plain DOM, no framework, no network but this server's API.
// Everything that comes from the user or the model is put in the page as text
// (textContent / text nodes), never parsed as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);

  // --- DOM helpers: strings always become text nodes ---
  function h(tag, props, ...kids) {
    const el = document.createElement(tag);
    if (props) {
      for (const [k, v] of Object.entries(props)) {
        if (v === null || v === undefined || v === false) continue;
        if (k === "class") el.className = v;
        else if (k === "text") el.textContent = String(v);
        else if (k === "dataset") Object.assign(el.dataset, v);
        else if (k === "style") Object.assign(el.style, v);
        else if (k.startsWith("on")) {
          if (typeof v !== "function") throw new TypeError("event handlers must be functions");
          el.addEventListener(k.slice(2), v);
        }
        else el.setAttribute(k, v === true ? "" : String(v));
      }
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }

  const WS = { " ": "·", "\n": "↵", "\t": "⇥", "\r": "␍" };

  // A token with its whitespace made visible: "·" for a space, "↵" for a newline.
  function visibleToken(text) {
    const out = h("span", { class: "tok-visible" });
    if (text === "") {
      out.appendChild(h("span", { class: "ws", text: "∅" }));
      return out;
    }
    let run = "";
    for (const ch of text) {
      if (WS[ch]) {
        if (run) out.appendChild(document.createTextNode(run));
        run = "";
        out.appendChild(h("span", { class: "ws", title: ch === " " ? "space" : ch === "\n" ? "newline" : "whitespace", text: WS[ch] }));
      } else {
        run += ch;
      }
    }
    if (run) out.appendChild(document.createTextNode(run));
    return out;
  }

  // --- formatting ---
  const nf = new Intl.NumberFormat("en-US");
  const int = (n) => nf.format(n);
  function pct(p) {
    if (p >= 0.9995) return "100%";
    if (p >= 0.1) return (p * 100).toFixed(1) + "%";
    if (p >= 0.0001) return (p * 100).toFixed(2) + "%";
    if (p > 0) return "<0.01%";
    return "0%";
  }
  function ms(x) {
    if (x >= 1000) return (x / 1000).toFixed(2) + " s";
    if (x >= 100) return x.toFixed(0) + " ms";
    if (x >= 10) return x.toFixed(1) + " ms";
    return x.toFixed(2) + " ms";
  }
  function bytes(n) {
    if (n >= 1e9) return (n / 1e9).toFixed(2) + " GB";
    if (n >= 1e6) return (n / 1e6).toFixed(1) + " MB";
    if (n >= 1e3) return (n / 1e3).toFixed(1) + " kB";
    return n + " B";
  }
  function usd(x) {
    if (!x) return "$0";
    if (x >= 1) return "$" + x.toFixed(2);
    if (x >= 0.01) return "$" + x.toFixed(4);
    return "$" + x.toPrecision(3).replace(/\.?0+e/, "e");
  }
  function usdPlain(x) {
    // Small dollar amounts without exponents: $0.0000248
    if (!x) return "$0";
    if (x >= 0.01) return "$" + x.toFixed(4);
    const digits = Math.min(12, Math.max(2, 2 - Math.floor(Math.log10(x))));
    return "$" + x.toFixed(digits);
  }
  // Millionths of a dollar, 3 significant digits: a request costs a few of them.
  function micro(x) {
    const u = x * 1e6;
    if (!u) return "0";
    if (u >= 1000) return nf.format(Math.round(u));
    return String(Number(u.toPrecision(3)));
  }
  const logit = (x) => x.toFixed(4);
  const baseName = (s) => String(s).split(/[\\/]/).filter(Boolean).pop() || String(s);

  // Probabilities at temperature T from the stored logits, as the server computes them:
  // softmax(logit / T) over the candidates; T = 0 puts all the mass on the best.
  function probsAt(logits, T) {
    const n = logits.length;
    const p = new Array(n).fill(0);
    if (!n) return p;
    if (T === 0) {
      let best = 0;
      for (let i = 1; i < n; i++) if (logits[i] > logits[best]) best = i;
      p[best] = 1;
      return p;
    }
    // subtract the best logit before dividing, so a tiny T gives 0s, never NaN
    let mx = -Infinity;
    for (const l of logits) mx = Math.max(mx, l);
    let sum = 0;
    for (let i = 0; i < n; i++) { p[i] = Math.exp((logits[i] - mx) / T); sum += p[i]; }
    for (let i = 0; i < n; i++) p[i] /= sum;
    return p;
  }

  // --- the API ---
  function detailOf(data, res) {
    const d = data && data.detail;
    if (typeof d === "string") return d;
    if (Array.isArray(d)) {
      return d.map((e) => {
        const where = (e.loc || []).filter((x) => x !== "body").join(".");
        return (where ? where + ": " : "") + (e.msg || "invalid");
      }).join("; ");
    }
    return `the server answered ${res.status} ${res.statusText}`;
  }

  async function api(method, path, body) {
    const opts = { method, headers: {} };
    if (body !== undefined) {
      opts.headers["content-type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, opts);
    } catch (e) {
      throw new Error("the server could not be reached: " + e.message);
    }
    let data = null;
    try { data = await res.json(); } catch (_) { data = null; }
    if (!res.ok) throw new Error(detailOf(data, res));
    return data;
  }

  // POST that answers with server-sent events; onEvent(name, data) for each block.
  async function stream(path, body, onEvent) {
    let res;
    try {
      res = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    } catch (e) {
      throw new Error("the server could not be reached: " + e.message);
    }
    if (!res.ok) {
      let data = null;
      try { data = await res.json(); } catch (_) { data = null; }
      throw new Error(detailOf(data, res));
    }
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    const flush = (block) => {
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) onEvent(event, JSON.parse(data.join("\n")));
    };
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, i);
        buf = buf.slice(i + 2);
        if (block.trim()) flush(block);
      }
    }
    if (buf.trim()) flush(buf);
  }

  // --- errors ---
  function showError(e) {
    const el = $("error");
    el.replaceChildren(h("strong", { text: "Error: " }), document.createTextNode(e && e.message ? e.message : String(e)));
    el.classList.add("shown");
  }
  function clearError() {
    const el = $("error");
    el.replaceChildren();
    el.classList.remove("shown");
  }
  function setStatus(s) { $("status").textContent = s || ""; }

  // ==================================================================================
  //  Playground
  // ==================================================================================

  // A step's candidates depend only on the tokens before it, so steps are kept by the
  // ids of that prefix: they stay valid after a step back, a branch or a cut, and let
  // the branch tree bring a continuation back without asking the model again.
  const S = {
    info: null,
    textId: null,
    prompt: null, // the prompt string the current text was opened with
    promptLen: 0,
    tokens: [], // [{id, text}] every known token (beyond `length`: stepped back from)
    length: 0,
    serverSteps: new Set(), // positions whose step the server holds (branch by rank works there)
    memo: new Map(), // prefix key -> step JSON
    chosen: new Map(), // prefix key -> token id the user branched to
    paths: [], // the known token id sequences of this text, for the tree
    selected: null,
    generating: false,
    busy: false,
  };

  const keyAt = (p) => S.tokens.slice(0, p).map((t) => t.id).join(",");
  const stepAt = (p) => S.memo.get(keyAt(p));
  const temperature = () => Number($("temperature").value);

  function resetText() {
    S.textId = null; S.prompt = null; S.promptLen = 0; S.tokens = []; S.length = 0;
    S.serverSteps = new Set(); S.memo = new Map(); S.chosen = new Map(); S.paths = []; S.selected = null;
  }

  // The server's text JSON is the truth; take it whole.
  function applyText(t) {
    S.textId = t.id;
    S.tokens = t.tokens.map((x) => ({ id: x.token_id, text: x.text }));
    S.length = t.length;
    S.serverSteps = new Set();
    for (const [p, step] of Object.entries(t.steps || {})) {
      const pos = Number(p);
      S.serverSteps.add(pos);
      S.memo.set(keyAt(pos), step);
    }
    recordPath();
  }

  // A token streamed in: the same bookkeeping the server does.
  function applyStep(step) {
    const p = step.position;
    const key = keyAt(p);
    if (p < S.tokens.length && S.tokens[p].id === step.token_id) {
      S.length = p + 1; // the same token as the one kept: what follows stays known
    } else {
      S.tokens = S.tokens.slice(0, p).concat([{ id: step.token_id, text: step.text }]);
      S.length = p + 1;
    }
    S.memo.set(key, step);
    S.serverSteps.add(p);
  }

  function recordPath() {
    const ids = S.tokens.map((t) => t.id);
    const texts = S.tokens.map((t) => t.text);
    const isPrefix = (a, b) => a.length <= b.length && a.every((x, i) => x === b[i]);
    if (S.paths.some((q) => isPrefix(ids, q.ids))) return;
    S.paths = S.paths.filter((q) => !isPrefix(q.ids, ids));
    S.paths.push({ ids, texts });
  }

  // --- rendering: the token stream ---
  function chosenProb(step, id) {
    const c = step.candidates.find((x) => x.token_id === id);
    return c ? c.prob : 0;
  }
  function probOfT1(step, id) {
    const i = step.candidates.findIndex((x) => x.token_id === id);
    return i >= 0 && step.probs_t1 ? step.probs_t1[i] : 0;
  }
  function shade(p) {
    const light = 95 - 20 * Math.max(0, Math.min(1, p));
    return `hsl(245 85% ${light}%)`;
  }

  function renderTokens() {
    const box = $("tokens");
    if (!S.tokens.length) {
      box.replaceChildren(h("span", { class: "placeholder", text: "Tokens appear here as the model writes them." }));
      return;
    }
    const frag = document.createDocumentFragment();
    let key = "";
    for (let p = 0; p < S.tokens.length; p++) {
      const tok = S.tokens[p];
      const step = p > 0 ? S.memo.get(key) : undefined;
      const ghost = p >= S.length;
      const classes = ["token", ghost ? "ghost" : step ? "generated" : "prompt"];
      if (S.selected === p) classes.push("selected");
      if (S.chosen.get(key) === tok.id) classes.push("branched");
      if (tok.text === "<|endoftext|>") classes.push("eot");
      let title = `position ${p} · token id ${tok.id}`;
      const style = {};
      if (step) {
        const pc = chosenProb(step, tok.id);
        if (!ghost) style.backgroundColor = shade(pc);
        title += ` · chosen with p = ${pct(pc)} at T = ${step.temperature} · p = ${pct(probOfT1(step, tok.id))} at T = 1`;
      } else if (!ghost) {
        title += " · prompt token";
      }
      if (ghost) title += " · stepped back: Forward brings it back";
      const shown = tok.text.replace(/\n/g, "↵\n");
      frag.appendChild(h("span", {
        class: classes.join(" "), dataset: { position: String(p), tokenId: String(tok.id) },
        tabindex: "0", role: "button", title, style,
      }, shown === "" ? "∅" : shown));
      key = p === 0 ? String(tok.id) : key + "," + tok.id;
    }
    box.replaceChildren(frag);
  }

  // --- rendering: the candidate panel ---
  function renderCandidates() {
    const box = $("candidates");
    const p = S.selected;
    if (p === null || p >= S.tokens.length) {
      box.replaceChildren(h("p", { class: "placeholder", text: "Click a generated token to see the candidates the model chose it from." }));
      return;
    }
    const tok = S.tokens[p];
    const step = p > 0 ? stepAt(p) : undefined;
    if (!step) {
      box.replaceChildren(
        h("div", { class: "sel-head" },
          h("span", { class: "sel-token" }, visibleToken(tok.text)),
          h("span", { class: "sel-meta", text: `position ${p} · token id ${tok.id}` })),
        h("p", { class: "note", text: "This token is part of the prompt: the model read it, it did not choose it. " +
          "The whole prompt is read in one batched forward when the first token is generated; select that token to see its requests." }));
      return;
    }
    const T = temperature();
    const logits = step.candidates.map((c) => c.logit);
    const pT = probsAt(logits, T);
    const p1 = step.probs_t1 || probsAt(logits, 1);
    const k = step.candidates.length;
    const vocab = S.info ? S.info.config.n_vocab : 50257;
    const ghost = p >= S.length;

    const head = h("div", { class: "sel-head" },
      h("span", { class: "sel-token" }, visibleToken(tok.text)),
      h("span", { class: "sel-meta", text: `position ${p} · token id ${tok.id}` }),
      h("span", { class: "badge " + (step.read > 1 ? "b-prefill" : step.read === 1 ? "b-decode" : "b-replay"),
        text: step.read > 1 ? "prefill" : step.read === 1 ? "decode" : "replayed" }));
    const pc = chosenProb(step, tok.id);
    const explain = h("p", { class: "note" },
      `The final vector searched the ${int(vocab)} token vectors; these are the ${k} best, with their scores (logits). `,
      step.temperature === 0
        ? "It was generated at T = 0: the best candidate is always taken."
        : `It was sampled at T = ${step.temperature}, where this token had p = ${pct(pc)}.`,
      S.chosen.get(keyAt(p)) === tok.id ? " You put it here with a branch." : "",
      ghost ? " (Stepped back: branching from here steps forward first.)" : "");

    const table = h("table", { class: "cand-table" },
      h("thead", null, h("tr", null,
        h("th", { class: "num", text: "#" }),
        h("th", { text: "token" }),
        h("th", { class: "num", title: "the search score: the dot product of the final vector with the token's vector", text: "logit" }),
        h("th", { class: "num", text: "p at T=1" }),
        h("th", { class: "num", id: "p-temp-head", title: "recomputed here from the logits as you move the temperature slider", text: `p at T=${T.toFixed(2)}` }),
        h("th", { class: "num", text: "cumulative" }),
        h("th", { class: "act", text: "" }))),
      h("tbody", null, step.candidates.map((c, i) => candidateRow(c, i, p, p1[i], tok.id))));
    box.replaceChildren(head, explain, h("div", { class: "table-scroll" }, table));
    updateProbs(pT);
  }

  function probCell(cls, rank) {
    return h("td", { class: "num prob " + cls, dataset: { rank: String(rank) } },
      h("span", { class: "pbar" }), h("span", { class: "pval" }));
  }
  function setProb(td, p) {
    td.querySelector(".pbar").style.width = (Math.max(0, Math.min(1, p)) * 100).toFixed(1) + "%";
    td.querySelector(".pval").textContent = pct(p);
  }

  function candidateRow(c, i, position, p1, current) {
    const isChosen = c.token_id === current;
    const tr = h("tr", { class: isChosen ? "chosen" : null, dataset: { rank: String(i), tokenId: String(c.token_id) } },
      h("td", { class: "num rank", text: String(i + 1) }),
      h("td", { class: "tok" }, visibleToken(c.text), h("span", { class: "tid", text: String(c.token_id) })),
      h("td", { class: "num", text: logit(c.logit) }),
      probCell("p-t1", i),
      probCell("p-t", i),
      h("td", { class: "num cum", dataset: { rank: String(i) } }),
      h("td", { class: "act" },
        h("button", {
          type: "button", class: "branch", dataset: { rank: String(i), position: String(position) },
          disabled: isChosen || S.generating || S.busy,
          title: isChosen ? "this is the token at this position" : `Put “${c.text}” at position ${position} and continue generating`,
          onclick: () => branchTo(position, { rank: i, token_id: c.token_id }),
        }, isChosen ? "chosen" : "branch")));
    setProb(tr.children[3], p1);
    return tr;
  }

  // The temperature slider: recomputed here from the stored logits, no request.
  function updateProbs(pT) {
    const box = $("candidates");
    const rows = box.querySelectorAll("tbody tr");
    if (!rows.length) return;
    const step = stepAt(S.selected);
    if (!step) return;
    const T = temperature();
    if (!pT) pT = probsAt(step.candidates.map((c) => c.logit), T);
    const headCell = $("p-temp-head");
    if (headCell) headCell.textContent = `p at T=${T.toFixed(2)}`;
    let cum = 0;
    rows.forEach((tr, i) => {
      cum += pT[i];
      setProb(tr.querySelector(".p-t"), pT[i]);
      tr.querySelector(".cum").textContent = pct(Math.min(1, cum));
    });
  }

  // --- rendering: the waterfall ---
  const KIND_HELP = [
    [/^embed$/, "fetch the token's and position's vectors"],
    [/^ln$/, "fetch the layer-norm parameters"],
    [/attn\.c_attn$/, "queries, keys, values: one search"],
    [/attn\.keys$/, "write the new keys to this text"],
    [/attn\.scores$/, "attention: queries search earlier keys"],
    [/attn\.c_proj$/, "attention output projection"],
    [/mlp\.c_fc$/, "MLP up-projection (GELU after)"],
    [/mlp\.c_proj$/, "MLP down-projection"],
    [/^wte\.top_k$/, "next token: top-k over the vocabulary"],
  ];
  const kindHelp = (kind) => (KIND_HELP.find(([re]) => re.test(kind)) || [null, ""])[1];

  function renderWaterfall() {
    const box = $("waterfall");
    const p = S.selected;
    const step = p !== null && p > 0 && p < S.tokens.length ? stepAt(p) : undefined;
    if (!step) {
      box.replaceChildren(h("p", { class: "placeholder", text: p === null
        ? "Every search, write and fetch that produced the selected token, as a waterfall."
        : "A prompt token costs no requests of its own: it was read with the rest of the prompt." }));
      return;
    }
    const log = step.request_log || [];
    const reqMs = log.reduce((a, r) => a + r.ms, 0);
    const total = Math.max(step.ms, reqMs, 1e-9);
    const summary = h("div", { class: "wf-summary" },
      h("div", { class: "stat" }, h("b", { text: int(log.length) }), h("span", { text: "requests" })),
      h("div", { class: "stat" }, h("b", { text: ms(step.ms) }), h("span", { text: "total" })),
      h("div", { class: "stat", title: "at turbopuffer's list rates" }, h("b", { text: usdPlain(step.cost_usd) }),
        h("span", { text: `cost · ${usd(step.cost_usd * 1e6)} per million tokens` })),
      h("div", { class: "stat" }, h("b", { text: step.read > 1 ? int(step.read) : step.read === 1 ? "1" : "0" }), h("span", { text: "tokens read" })));
    let note;
    if (!log.length) {
      note = "Replayed: these candidates were already known (the model had read this prefix before), so this token cost no request.";
    } else if (step.read > 1) {
      note = `Prefill: this token's requests read all ${step.read} unread tokens at once; each search carries one query per token, so the whole prompt cost the same ${log.length} requests as one token.`;
    } else {
      note = "Decode: one token read, one full pass through the model. Each request waits for the one before it.";
    }
    const rows = [];
    let t0 = 0;
    log.forEach((r, i) => {
      const left = (t0 / total) * 100;
      const width = Math.max(0.6, (r.ms / total) * 100);
      t0 += r.ms;
      rows.push(h("tr", { class: "wf-row op-" + r.op, dataset: { kind: r.kind } },
        h("td", { class: "num idx", text: String(i + 1) }),
        h("td", { class: "kind" },
          h("span", { class: "op op-" + r.op, title: r.op, text: r.op }),
          h("code", { text: r.kind }),
          h("span", { class: "what", text: kindHelp(r.kind) })),
        h("td", { class: "num", title: "queries in this one request", text: r.queries ? int(r.queries) : "–" }),
        h("td", { class: "num", title: r.op === "search" ? "documents scored" : r.op === "write" ? "documents written" : "documents fetched", text: int(r.rows) }),
        h("td", { class: "num", text: bytes(r.bytes) }),
        h("td", { class: "bar-cell" }, h("div", { class: "track" },
          h("div", { class: "bar op-" + r.op, style: { left: left.toFixed(2) + "%", width: Math.min(width, 100 - left).toFixed(2) + "%" } }))),
        h("td", { class: "num", text: ms(r.ms) }),
        h("td", { class: "num cost", title: usdPlain(r.cost_usd), text: micro(r.cost_usd) })));
    });
    const rest = step.ms - reqMs;
    if (log.length && rest > 0) {
      rows.push(h("tr", { class: "wf-row wf-server" },
        h("td", { class: "num idx", text: "" }),
        h("td", { class: "kind" }, h("span", { class: "op op-server", text: "server" }),
          h("span", { class: "what", text: "layer norm, GELU, softmax, additions, sampling" })),
        h("td"), h("td"), h("td"),
        h("td", { class: "bar-cell" }, h("div", { class: "track" })),
        h("td", { class: "num", text: ms(rest) }),
        h("td", { class: "num cost", text: "–" })));
    }
    const table = h("table", { class: "wf-table" },
      h("thead", null, h("tr", null,
        h("th", { class: "num", text: "#" }), h("th", { text: "request" }), h("th", { class: "num", text: "queries" }),
        h("th", { class: "num", text: "rows" }), h("th", { class: "num", text: "bytes" }), h("th", { text: "latency" }),
        h("th", { class: "num", text: "ms" }), h("th", { class: "num", title: "millionths of a dollar at turbopuffer's list rates", text: "µ$" }))),
      h("tbody", null, rows));
    box.replaceChildren(summary, h("p", { class: "note", text: note }), log.length ? h("div", { class: "table-scroll wf-scroll" }, table) : "");
  }

  // --- rendering: prefill and decode ---
  function renderPhases() {
    const box = $("phases");
    const steps = [];
    for (let p = 1; p < S.length; p++) {
      const s = stepAt(p);
      if (s) steps.push(s);
    }
    if (!steps.length) {
      box.replaceChildren(h("p", { class: "placeholder", text: "Generate to see what reading the prompt and writing each token cost." }));
      return;
    }
    const pre = steps.filter((s) => s.read > 1);
    const dec = steps.filter((s) => s.read === 1);
    const rep = steps.filter((s) => s.read === 0);
    const sum = (a, f) => a.reduce((x, s) => x + f(s), 0);
    const perToken = S.info ? S.info.requests_per_token : null;

    const preTokens = sum(pre, (s) => s.read), preReq = sum(pre, (s) => s.requests), preMs = sum(pre, (s) => s.ms), preCost = sum(pre, (s) => s.cost_usd);
    const decReq = sum(dec, (s) => s.requests), decMs = sum(dec, (s) => s.ms), decCost = sum(dec, (s) => s.cost_usd);

    const preBox = h("div", { class: "phase phase-prefill" },
      h("h3", { text: "Prefill" }),
      pre.length
        ? [h("p", { class: "big" }, h("b", { text: int(preTokens) }), " tokens read in ", h("b", { text: int(preReq) }), " requests"),
          h("p", { text: `${ms(preMs)} · ${usdPlain(preCost)}` }),
          h("p", { class: "note", text: `One batched forward: every request carried all ${int(preTokens)} tokens as queries. ` +
            `Read one at a time they would have taken ${int(preTokens * (perToken || preReq / pre.length))} requests.` })]
        : h("p", { class: "note", text: "Nothing was read in a batch (a one-token prompt is read like a decode)." }));
    const decBox = h("div", { class: "phase phase-decode" },
      h("h3", { text: "Decode" }),
      dec.length
        ? [h("p", { class: "big" }, h("b", { text: ms(decMs / dec.length) }), " per token"),
          h("p", { text: `${(decReq / dec.length).toFixed(decReq % dec.length ? 1 : 0)} requests/token · ${usdPlain(decCost / dec.length)}/token · ${int(dec.length)} tokens` }),
          h("p", { class: "note", text: "Each new token is one full pass: its requests run one after another, so latency is requests × round trip." })]
        : h("p", { class: "note", text: "No token decoded one at a time yet." }));
    const kids = [preBox, decBox];
    if (rep.length) {
      kids.push(h("div", { class: "phase phase-replay" },
        h("h3", { text: "Replayed" }),
        h("p", { class: "big" }, h("b", { text: int(rep.length) }), " tokens, 0 requests"),
        h("p", { class: "note", text: "Their candidates were already known from an earlier pass over the same prefix." })));
    }
    if (pre.length && dec.length) {
      const oneByOne = preTokens * (decReq / dec.length);
      kids.push(h("p", { class: "saving" }, "Batching: ", h("b", { text: `${int(preTokens)} prompt tokens cost ${int(preReq)} requests instead of ${int(Math.round(oneByOne))}` }),
        ` — ${(oneByOne / Math.max(1, preReq)).toFixed(1)}× fewer round trips than reading them one by one.`));
    }
    box.replaceChildren(...kids);
  }

  // --- rendering: the branch tree ---
  function buildTrie() {
    const root = { children: new Map(), pathIndex: -1 };
    S.paths.forEach((path, pi) => {
      let node = root;
      for (let p = S.promptLen; p < path.ids.length; p++) {
        const id = path.ids[p];
        if (!node.children.has(id)) node.children.set(id, { pos: p, id, text: path.texts[p], children: new Map(), pathIndex: pi });
        node = node.children.get(id);
        node.pathIndex = pi; // the latest path through it
      }
    });
    return root;
  }

  function renderTree() {
    const box = $("tree");
    if (!S.textId || S.paths.length === 0) {
      box.replaceChildren(h("p", { class: "placeholder", text: "Branch from a candidate to explore another continuation; every branch you take is kept here." }));
      return;
    }
    const root = buildTrie();
    const cur = S.tokens.slice(0, S.length).map((t) => t.id);
    const onPath = (node) => node.pos < cur.length && cur[node.pos] === node.id;

    // A segment: a run of tokens up to the next place where the text forks.
    function segments(node, parentOnPath) {
      const items = [];
      for (const child of node.children.values()) {
        const run = [child];
        let end = child;
        while (end.children.size === 1) {
          end = end.children.values().next().value;
          run.push(end);
        }
        const current = parentOnPath && run.every(onPath) ? "all" : parentOnPath && onPath(child) ? "part" : "";
        const text = run.map((n) => n.text).join("");
        const label = text.length > 48 ? text.slice(0, 47) + "…" : text;
        const btn = h("button", {
          type: "button", class: "tree-node" + (current ? " current" : ""),
          dataset: { position: String(child.pos), tokenId: String(child.id) },
          title: `from position ${child.pos}: ${run.length} token${run.length === 1 ? "" : "s"}. Click to go to this branch.`,
          disabled: S.generating || S.busy,
          onclick: () => goToPath(S.paths[end.pathIndex]),
        }, h("span", { class: "tree-pos", text: "@" + child.pos }), h("span", { class: "tree-text", text: label.replace(/\n/g, "↵") }));
        const li = h("li", null, btn);
        if (end.children.size > 1) li.appendChild(h("ul", null, segments(end, current === "all")));
        items.push(li);
      }
      return items;
    }
    const promptText = S.tokens.slice(0, S.promptLen).map((t) => t.text).join("");
    const rootLabel = promptText.length > 60 ? "…" + promptText.slice(-59) : promptText;
    const forks = S.paths.length;
    box.replaceChildren(
      h("p", { class: "note", text: forks > 1
        ? `${forks} continuations of this prompt. Click one to go back to it: the tokens are put back with branches, and only what the model has not read costs requests when you generate again.`
        : "One continuation so far. Branch from a candidate in the table to fork the text." }),
      h("ul", { class: "tree-root" }, h("li", null,
        h("span", { class: "tree-prompt", title: "the prompt", text: rootLabel.replace(/\n/g, "↵") }),
        root.children.size ? h("ul", null, segments(root, true)) : "")));
  }

  // --- rendering: controls ---
  function renderControls() {
    const running = S.generating || S.busy;
    $("generate").disabled = running;
    $("stop").disabled = !S.generating;
    $("step-back").disabled = running || !S.textId || S.length <= 1;
    $("step-forward").disabled = running || !S.textId || S.length >= S.tokens.length;
    $("cut").disabled = running || !S.textId || S.selected === null || S.selected < 1 || S.selected >= S.length;
    document.querySelectorAll("#candidates .branch").forEach((b) => {
      b.disabled = running || b.closest("tr").classList.contains("chosen");
    });
    document.querySelectorAll("#tree .tree-node").forEach((b) => { b.disabled = running; });
  }

  function renderAll() {
    renderTokens();
    renderCandidates();
    renderWaterfall();
    renderPhases();
    renderTree();
    renderControls();
  }

  function select(p) {
    S.selected = p;
    document.querySelectorAll("#tokens .token.selected").forEach((el) => el.classList.remove("selected"));
    const el = document.querySelector(`#tokens .token[data-position="${p}"]`);
    if (el) el.classList.add("selected");
    renderCandidates();
    renderWaterfall();
    renderControls();
  }

  // --- actions ---
  function readNumber(id, lo, hi, name, fallback) {
    const raw = $(id).value.trim();
    if (raw === "") return fallback;
    const n = Number(raw);
    if (!Number.isInteger(n) || n < lo || n > hi) throw new Error(`${name} must be a whole number from ${lo} to ${hi}`);
    return n;
  }

  function samplingBody() {
    const maxNew = S.info ? S.info.max_new_tokens : 512;
    const vocab = S.info ? S.info.config.n_vocab : 50257;
    return {
      max_tokens: readNumber("max-tokens", 1, maxNew, "Max tokens", 20),
      temperature: temperature(),
      top_k: readNumber("top-k", 1, vocab, "Top-k", 40),
      seed: readNumber("seed", 0, Number.MAX_SAFE_INTEGER, "Seed", null),
    };
  }

  async function ensureText() {
    const prompt = $("prompt").value;
    if (!prompt.trim()) throw new Error("type a prompt first");
    if (S.textId && prompt === S.prompt) return;
    const old = S.textId;
    resetText();
    renderAll();
    if (old) api("DELETE", `/api/texts/${encodeURIComponent(old)}`).catch(() => {});
    const t = await api("POST", "/api/texts", { prompt });
    S.prompt = prompt;
    S.promptLen = t.length;
    applyText(t);
  }

  async function generate(opts = {}) {
    if (S.generating) return;
    clearError();
    let body;
    try {
      body = samplingBody();
    } catch (e) { showError(e); return; }
    S.generating = true;
    renderControls();
    setStatus("generating…");
    let first = null;
    let got = 0;
    try {
      if (!opts.keepText) await ensureText();
      first = S.length;
      renderAll();
      await stream(`/api/texts/${encodeURIComponent(S.textId)}/generate`, body, (event, data) => {
        if (event === "token") {
          got++;
          applyStep(data);
          renderTokens();
          renderPhases();
          if (S.selected === null && got === 1) select(data.position);
          setStatus(`generating… ${got} token${got === 1 ? "" : "s"}`);
        } else if (event === "done") {
          applyText(data.text);
          setStatus(`${data.tokens} token${data.tokens === 1 ? "" : "s"} · ${int(data.requests)} requests · ${ms(data.ms)}${data.stopped ? " · stopped" : ""}`);
        } else if (event === "error") {
          throw new Error(data.detail);
        }
      });
    } catch (e) {
      showError(e);
      setStatus("");
    } finally {
      S.generating = false;
      if (S.selected !== null && S.selected >= S.tokens.length) S.selected = null;
      if (S.selected === null && first !== null && first < S.length) S.selected = first;
      renderAll();
    }
  }

  async function stop() {
    if (!S.textId || !S.generating) return;
    setStatus("stopping…"); // before the request: the stream's `done` may come back first
    try {
      await api("POST", `/api/texts/${encodeURIComponent(S.textId)}/stop`);
    } catch (e) { showError(e); }
  }

  // An edit: one or more calls, then the text as the server has it.
  async function edit(fn) {
    if (!S.textId || S.generating || S.busy) return false;
    clearError();
    S.busy = true;
    renderControls();
    try {
      await fn();
      return true;
    } catch (e) {
      showError(e);
      return false;
    } finally {
      S.busy = false;
      if (S.selected !== null && S.selected >= S.tokens.length) S.selected = null;
      renderAll();
    }
  }
  const call = async (op, body) => applyText(await api("POST", `/api/texts/${encodeURIComponent(S.textId)}/${op}`, body));

  async function stepBack() {
    await edit(() => call("step_back", { position: S.length - 1 }));
  }
  async function stepForward() {
    await edit(() => call("step_forward", { position: S.length + 1 }));
  }
  async function cut() {
    const p = S.selected;
    if (p === null) return;
    await edit(async () => {
      await call("cut", { position: p });
      S.selected = p - 1 >= 0 ? p - 1 : null;
    });
  }

  // Branch at position p to the candidate of that rank, then keep generating.
  async function branchTo(p, { rank, token_id }) {
    const key = keyAt(p);
    const ok = await edit(async () => {
      if (p > S.length) await call("step_forward", { position: p });
      // By rank where the server holds the step; by token id where only this page does.
      await call("branch", S.serverSteps.has(p) && rank !== undefined ? { position: p, rank } : { position: p, token_id });
      S.chosen.set(key, token_id);
      S.selected = p;
    });
    if (ok) await generate({ keepText: true });
  }

  // Move to a recorded continuation: branch at the first token that differs, then put
  // the rest back (no search: the model reads them, in one batch, when it next generates).
  async function goToPath(path) {
    const { ids, texts } = path;
    await edit(async () => {
      const cur = S.tokens.map((t) => t.id);
      let d = 0;
      while (d < Math.min(cur.length, ids.length) && cur[d] === ids[d]) d++;
      if (d >= ids.length) { // the path is what the text knows already: step there, for free
        if (ids.length < S.length) await call("step_back", { position: ids.length });
        else if (ids.length > S.length) await call("step_forward", { position: ids.length });
        return;
      }
      if (d > S.length) await call("step_forward", { position: d });
      const key = keyAt(d);
      await call("branch", { position: d, token_id: ids[d] });
      S.chosen.set(key, ids[d]);
      S.selected = d;
      // The rest in one append; where the tokenizer would split its text differently,
      // the recorded tokens are put back one by one (a branch at the end of the text).
      const rest = texts.slice(d + 1).join("");
      if (rest) {
        try { await call("append", { text: rest }); } catch (_) { /* the text is left as it was; put them back one by one */ }
      }
      let m = d + 1;
      while (m < ids.length && m < S.length && S.tokens[m].id === ids[m]) m++;
      for (let q = m; q < ids.length; q++) await call("branch", { position: q, token_id: ids[q] });
      if (S.length > ids.length) await call("cut", { position: ids.length });
    });
  }

  async function compare() {
    clearError();
    const prompt = $("prompt").value;
    const box = $("compare-result");
    if (!prompt.trim()) { showError(new Error("type a prompt first")); return; }
    let top_k;
    try { top_k = readNumber("top-k", 1, S.info ? S.info.config.n_vocab : 50257, "Top-k", 40); } catch (e) { showError(e); return; }
    const btn = $("compare");
    btn.disabled = true;
    box.replaceChildren(h("p", { class: "placeholder", text: "Running the prompt twice: through the searches, and through numpy…" }));
    try {
      const r = await api("POST", "/api/compare", { prompt, top_k });
      const diff = r.max_abs_diff;
      const summary = h("div", { class: "cmp-summary" },
        h("div", { class: "stat big-stat" }, h("b", { class: "max-diff", text: diff === null ? "n/a" : diff.toExponential(2) }), h("span", { text: "max |search − numpy|" })),
        h("div", { class: "stat" }, h("b", { text: r.same_ids ? "yes" : "no" }), h("span", { text: "same tokens, same order" })),
        h("div", { class: "stat" }, h("b", { text: `${int(r.search.requests)} req · ${ms(r.search.ms)}` }), h("span", { text: "vector search" })),
        h("div", { class: "stat" }, h("b", { text: ms(r.reference.ms) }), h("span", { text: "numpy, weights in memory" })));
      const rows = r.rows.map((row) => {
        const d = row.reference === null ? null : Math.abs(row.search - row.reference);
        return h("tr", null,
          h("td", { class: "num", text: String(row.rank + 1) }),
          h("td", { class: "tok" }, visibleToken(row.text), h("span", { class: "tid", text: String(row.token_id) })),
          h("td", { class: "num", text: row.search.toFixed(6) }),
          h("td", { class: "num", text: row.reference === null ? "not in numpy's top-k" : row.reference.toFixed(6) }),
          h("td", { class: "num", text: d === null ? "–" : d.toExponential(1) }));
      });
      const table = h("table", { class: "cmp-table" },
        h("thead", null, h("tr", null, h("th", { class: "num", text: "#" }), h("th", { text: "token" }),
          h("th", { class: "num", text: "search logit" }), h("th", { class: "num", text: "numpy logit" }), h("th", { class: "num", text: "|diff|" }))),
        h("tbody", null, rows));
      box.replaceChildren(summary,
        h("p", { class: "note", text: `The next-token scores for the ${int(r.prompt_tokens)}-token prompt, computed by searches in the store and by a plain numpy GPT-2 with the same weights. The differences are float32 rounding.` }),
        h("div", { class: "table-scroll" }, table));
    } catch (e) {
      box.replaceChildren();
      showError(e);
    } finally {
      btn.disabled = false;
    }
  }

  function renderInfo(info) {
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
      ["search", `${String(info.metric).replace(/_/g, " ")} · ${info.backend}`],
    ];
    $("info").replaceChildren(...items.map(([k, v]) => h("span", { class: "info-item" }, h("span", { class: "k", text: k }), h("span", { class: "v", text: v }))));
  }

  function initPlayground() {
    const temp = $("temperature");
    const showTemp = () => { $("temperature-value").textContent = Number(temp.value).toFixed(2); };
    temp.addEventListener("input", () => { showTemp(); updateProbs(); });
    showTemp();
    $("generate").addEventListener("click", () => generate());
    $("stop").addEventListener("click", stop);
    $("step-back").addEventListener("click", stepBack);
    $("step-forward").addEventListener("click", stepForward);
    $("cut").addEventListener("click", cut);
    $("compare").addEventListener("click", compare);
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); generate(); }
    });
    document.querySelectorAll(".starter").forEach((b) => b.addEventListener("click", () => {
      $("prompt").value = b.dataset.prompt;
      generate();
    }));
    const tokens = $("tokens");
    const pick = (e) => {
      const el = e.target.closest(".token");
      if (el) select(Number(el.dataset.position));
    };
    tokens.addEventListener("click", pick);
    tokens.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); pick(e); }
      if ((e.key === "ArrowRight" || e.key === "ArrowLeft") && S.selected !== null) {
        const p = S.selected + (e.key === "ArrowRight" ? 1 : -1);
        if (p >= 0 && p < S.tokens.length) {
          e.preventDefault();
          select(p);
          const el = document.querySelector(`#tokens .token[data-position="${p}"]`);
          if (el) el.focus();
        }
      }
    });
    window.addEventListener("beforeunload", () => {
      // Close the text so the server drops its keys.
      if (S.textId) fetch(`/api/texts/${encodeURIComponent(S.textId)}`, { method: "DELETE", keepalive: true }).catch(() => {});
    });
    api("GET", "/api/info").then((info) => {
      S.info = info;
      renderInfo(info);
      $("max-tokens").max = String(info.max_new_tokens);
      $("top-k").max = String(info.config.n_vocab);
      renderAll();
    }).catch((e) => {
      $("info").textContent = "The model's details could not be loaded.";
      showError(e);
    });
    renderAll();
  }

  // ==================================================================================
  //  How this works: the loaded model's live figures
  // ==================================================================================
  function initHow() {
    api("GET", "/api/info").then((info) => {
      const c = info.config;
      const L = c.n_layer;
      const values = {
        model: baseName(info.model),
        documents: int(info.documents),
        megabytes: info.megabytes + " MB",
        requests_per_token: int(info.requests_per_token),
        layers: int(L),
        width: int(c.n_embd),
        heads: int(c.n_head),
        head_dim: int(c.n_embd / c.n_head),
        vocab: int(c.n_vocab),
        context: int(c.n_ctx),
        metric: String(info.metric).replace(/_/g, " "),
        backend: String(info.backend),
        storage: usdPlain(info.storage_usd_per_month || 0) + " a month",
        layer_requests: int(6 * L),
        query_min_gb: info.rates ? String(info.rates.query_min_gb) : "",
        query_per_pb: info.rates ? "$" + info.rates.query_per_pb : "",
        returned_per_gb: info.rates ? "$" + info.rates.returned_per_gb : "",
        write_per_gb: info.rates ? "$" + info.rates.write_per_gb : "",
        rates_date: info.rates ? String(info.rates.date) : "",
      };
      document.querySelectorAll("[data-live]").forEach((el) => {
        const v = values[el.dataset.live];
        if (v !== undefined) el.textContent = v;
      });
      const fig = $("how-figures");
      if (fig) fig.classList.add("loaded");
    }).catch((e) => {
      const el = $("error");
      if (el) showError(e);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    const page = document.body.dataset.page;
    if (page === "playground") initPlayground();
    else if (page === "how") initHow();
  });
})();
