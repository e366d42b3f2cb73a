// A text any server can continue. The page keeps what rebuilds its text (the token ids, the
// positions the model generated, the tree, the selected token, the open views); when the
// server it asks does not hold the text (404 text_not_found: the server went away, or the
// text sat unused past its time), the page reopens it there from its ids (one prefill), says
// so in one line, and does what it was doing again.
import { api } from "./api.js";
import { setNotice } from "./dom.js";
import { ms, plural } from "./format.js";
import { S, applyText, rebuildBody } from "./state.js";

const MAX_REOPENS = 2; // for one action: more means the balancer moves every request elsewhere
let reopening = null; // the reopen in flight: the panels that find the text gone wait for it

async function reopen() {
  const t0 = performance.now();
  const t = await api("POST", "/api/texts", rebuildBody());
  applyText(t);
  const r = t.reopened || {};
  setNotice(`The server no longer held this text (it went away, or the text sat unused too long): it was reopened ` +
    `from its ${plural(S.tokens.length, "token")} in one prefill (${plural(r.requests ?? 0, "request")}, ` +
    `${ms(performance.now() - t0)}). Nothing you did is lost.`);
}

async function reopenOnce() {
  if (!reopening) reopening = reopen().finally(() => { reopening = null; });
  return reopening;
}

// fn() (a call about S.textId, read when it runs), again after reopening the text where the
// server answered text_not_found.
export async function withText(fn) {
  for (let reopened = 0; ; ) {
    const id = S.textId;
    try {
      return await fn();
    } catch (e) {
      if (e.code !== "text_not_found" || !S.textId) throw e;
      if (reopening) { await reopening; continue; } // another panel is reopening it
      if (S.textId !== id) continue; // reopened meanwhile: ask again under the new id
      if (reopened === MAX_REOPENS) {
        throw new Error(`the text was reopened ${MAX_REOPENS} times and the next request still reached a server ` +
          "without it: the load balancer sends each request to another server; give it stickiness (docs/deploy.md)");
      }
      reopened++;
      await reopenOnce();
    }
  }
}
