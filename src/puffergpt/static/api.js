// This server's API: JSON calls and the server-sent events of a generation.
// An error becomes an Error whose message is the server's own (every error answers
// {"error": {"message", "type", "param", "code"}}), with the answer's `status` and `code`
// (a text this server does not hold: "text_not_found"), and `lost` set when the server
// could not be reached or went away mid-answer. Every request carries the server's API key
// (serve --api-key) when the learner gave one: kept in this browser only.

const KEY = "puffergpt.apiKey";

export function apiKey() {
  try { return localStorage.getItem(KEY) || ""; } catch (_) { return ""; }
}

export function setApiKey(value) {
  try { if (value) localStorage.setItem(KEY, value); else localStorage.removeItem(KEY); } catch (_) { /* private mode */ }
}

// The headers with `Authorization: Bearer KEY` added when there is a key.
export function withKey(headers = {}) {
  const k = apiKey();
  return k ? { ...headers, authorization: `Bearer ${k}` } : headers;
}

function errorOf(data) {
  return data && typeof data.error === "object" && data.error !== null ? data.error : {};
}

function failure(data, res) {
  const err = errorOf(data);
  const e = new Error(typeof err.message === "string" && err.message
    ? err.message : `the server answered ${res.status} ${res.statusText}`);
  e.status = res.status;
  e.code = typeof err.code === "string" ? err.code : null;
  return e;
}

function lost(message) {
  const e = new Error(message);
  e.lost = true;
  return e;
}

async function send(path, opts) {
  try {
    return await fetch(path, { ...opts, headers: withKey(opts.headers) });
  } catch (e) {
    throw lost("the server could not be reached: " + e.message);
  }
}

export async function api(method, path, body, headers = {}) {
  const opts = { method, headers: { ...headers } };
  if (body !== undefined) {
    opts.headers["content-type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  const res = await send(path, opts);
  let data = null;
  try { data = await res.json(); } catch (_) { data = null; }
  if (!res.ok) throw failure(data, res);
  return data;
}

export const textPath = (id, rest = "") => `/api/texts/${encodeURIComponent(id)}${rest}`;

// One event block of a server-sent stream -> onEvent(name, data).
function flush(block, onEvent) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  if (data.length) onEvent(event, JSON.parse(data.join("\n")));
}

// POST that answers with server-sent events; onEvent(name, data) for each block. `signal` (an
// AbortController's) closes the stream: the server stops the work within a step.
export async function stream(path, body, onEvent, signal = undefined) {
  const res = await send(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body), signal });
  if (!res.ok) {
    let data = null;
    try { data = await res.json(); } catch (_) { data = null; }
    throw failure(data, res);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    let got;
    try { got = await reader.read(); } catch (e) { throw lost("the connection to the server was lost mid-answer: " + e.message); }
    const { value, done } = got;
    if (done) break;
    buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, i);
      buf = buf.slice(i + 2);
      if (block.trim()) flush(block, onEvent);
    }
  }
  if (buf.trim()) flush(buf, onEvent);
}
