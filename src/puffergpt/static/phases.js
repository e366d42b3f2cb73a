// Prefill and decode side by side: what reading the prompt in one batch cost, and
// what each token written one at a time costs.
import { $, h, placeholder } from "./dom.js";
import { int, ms, plural, usdPlain } from "./format.js";
import { S, stepAt, view } from "./state.js";

function renderPhases() {
  const box = $("phases");
  const steps = [];
  for (let p = 1; p < S.length; p++) {
    const s = stepAt(p);
    if (s) steps.push(s);
  }
  if (!steps.length) {
    box.replaceChildren(placeholder("Generate to see what reading the prompt and writing each token cost."));
    return;
  }
  const pre = steps.filter((s) => s.read > 1);
  const dec = steps.filter((s) => s.read === 1);
  const rep = steps.filter((s) => s.read === 0);
  const sum = (a, f) => a.reduce((x, s) => x + f(s), 0);
  const perToken = S.info ? S.info.requests_per_token : null;

  const preTokens = sum(pre, (s) => s.read), preReq = sum(pre, (s) => s.requests), preMs = sum(pre, (s) => s.ms), preCost = sum(pre, (s) => s.cost_usd);
  const decReq = sum(dec, (s) => s.requests), decMs = sum(dec, (s) => s.ms), decCost = sum(dec, (s) => s.cost_usd);
  const preTrips = sum(pre, (s) => s.round_trips), decTrips = sum(dec, (s) => s.round_trips);

  // Every count is the server's own (step_json): requests, round trips, cost, time.
  const preBox = h("div", { class: "phase phase-prefill" },
    h("h3", { text: "Prefill" }),
    pre.length
      ? [h("p", { class: "big" }, h("b", { text: int(preTokens) }), " tokens read in ", h("b", { class: "n-requests", text: int(preReq) }), " requests"),
        h("p", { text: `${plural(preTrips, "round trip")} one after another · ${ms(preMs)} · ${usdPlain(preCost)}` }),
        h("p", { class: "note", text: `One batched forward${pre.length > 1 ? " each" : ""}: every request carried all the tokens it read as queries. ` +
          `Read one at a time they would have taken ${int(preTokens * (perToken || preReq / pre.length))} requests.` })]
      : h("p", { class: "note", text: "Nothing was read in a batch (a one-token prompt is read like a decode)." }));
  const per = (n) => (n / dec.length).toFixed(n % dec.length ? 1 : 0);
  const decBox = h("div", { class: "phase phase-decode" },
    h("h3", { text: "Decode" }),
    dec.length
      ? [h("p", { class: "big" }, h("b", { text: ms(decMs / dec.length) }), " per token"),
        h("p", { text: `${per(decReq)} requests/token, ${per(decTrips)} round trips/token (one after another) · ${usdPlain(decCost / dec.length)}/token · ${plural(dec.length, "token")}` }),
        h("p", { class: "note", text: "Each new token is one full pass: its searches run one after another, so latency is round trips × the time of one. " +
          `The ${plural(Math.round((decReq - decTrips) / dec.length), "key write")} of each token run beside them: nothing reads a token's keys before the next token.` })]
      : h("p", { class: "note", text: "No token decoded one at a time yet." }));
  const kids = [preBox, decBox];
  if (rep.length) {
    kids.push(h("div", { class: "phase phase-replay" },
      h("h3", { text: "Replayed" }),
      h("p", { class: "big" }, h("b", { text: int(rep.length) }), " tokens, 0 requests"),
      h("p", { class: "note", text: "Their candidates were already known from an earlier pass over the same prefix." })));
  }
  if (pre.length && dec.length) {
    const oneByOne = preTokens * (decTrips / dec.length);
    kids.push(h("p", { class: "saving" }, "Batching: ", h("b", { text: `${int(preTokens)} prompt tokens cost ${int(preTrips)} round trips instead of ${int(Math.round(oneByOne))}` }),
      ` — ${(oneByOne / Math.max(1, preTrips)).toFixed(1)}× fewer than reading them one by one.`));
  }
  box.replaceChildren(...kids);
}

export function initPhases() { view("phases", renderPhases); }
