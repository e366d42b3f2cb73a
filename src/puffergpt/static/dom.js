// DOM helpers. Everything that comes from the user or the model goes into the page
// as text (textContent / text nodes), never parsed as HTML.

export const $ = (id) => document.getElementById(id);

function setProps(el, props) {
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = String(v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") Object.assign(el.style, v);
    else if (k.startsWith("on")) {
      if (typeof v !== "function") throw new TypeError("event handlers must be functions");
      el.addEventListener(k.slice(2), v);
    } else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function addKids(el, kids) {
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.appendChild(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

// h("td", {class: "num", text: "3"}): strings always become text nodes.
export function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  setProps(el, props);
  return addKids(el, kids);
}

// The same for SVG elements (the 2D map).
export function svg(tag, props, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  setProps(el, props);
  return addKids(el, kids);
}

// --- tokens as text a learner can read ---

const WS = { " ": "·", "\n": "↵", "\t": "⇥", "\r": "␍" };
const WS_NAME = { " ": "space", "\n": "newline", "\t": "tab", "\r": "carriage return" };
const isWs = (s) => s !== "" && [...s].every((ch) => WS[ch]);

// The bytes of a token from the API's "bytes_hex" ("e6", "e6 97", "e697"...).
function hexBytes(hex) {
  const digits = String(hex || "").replace(/[^0-9a-fA-F]/g, "");
  const out = [];
  for (let i = 0; i + 1 < digits.length; i += 2) out.push(parseInt(digits.slice(i, i + 2), 16));
  return out;
}

// A token's bytes as pieces: whole UTF-8 characters as text, and each byte of a
// character split over several tokens as "<e6>" (GPT-2's tokens are byte-level).
function bytePieces(bytes) {
  const pieces = [];
  const dec = new TextDecoder("utf-8", { fatal: true });
  for (let i = 0; i < bytes.length;) {
    const c = bytes[i];
    const n = c < 0x80 ? 1 : (c >> 5) === 6 ? 2 : (c >> 4) === 14 ? 3 : (c >> 3) === 30 ? 4 : 0;
    let text = null;
    if (n && i + n <= bytes.length) {
      try { text = dec.decode(new Uint8Array(bytes.slice(i, i + n))); } catch (_) { text = null; }
    }
    if (text !== null) { pieces.push({ text }); i += n; } else { pieces.push({ byte: c }); i += 1; }
  }
  return pieces;
}

// Pieces of a token: its text, or, where the text has U+FFFD and the bytes are
// known, the bytes that did not make a whole character.
function pieces(text, hex) {
  if (hex && text.includes("\uFFFD")) return bytePieces(hexBytes(hex));
  return [{ text }];
}

const byteSpan = (b) => h("span", { class: "byte", title: `byte 0x${b.toString(16).padStart(2, "0")} of a character split over tokens`,
  text: `<${b.toString(16).padStart(2, "0")}>` });

// A token in a table: monospace, every space, newline and tab made visible.
export function visibleToken(text, hex) {
  const out = h("span", { class: "tok-visible" });
  if (text === "") return addKids(out, [h("span", { class: "ws", text: "∅" })]);
  for (const piece of pieces(text, hex)) {
    if (piece.byte !== undefined) { out.appendChild(byteSpan(piece.byte)); continue; }
    let run = "";
    for (const ch of piece.text) {
      if (!WS[ch]) { run += ch; continue; }
      if (run) out.appendChild(document.createTextNode(run));
      run = "";
      out.appendChild(h("span", { class: "ws", title: WS_NAME[ch], text: WS[ch] }));
    }
    if (run) out.appendChild(document.createTextNode(run));
  }
  return out;
}

// A token inside the running text: words read as words, but a token that is only
// spaces or newlines shows its marks (· ↵ ⇥), and split characters show their bytes.
export function streamToken(text, hex) {
  if (text === "") return [h("span", { class: "ws", text: "∅" })];
  if (isWs(text)) {
    return [...text].map((ch) => h("span", { class: "ws", title: WS_NAME[ch] }, WS[ch], ch === "\n" ? "\n" : ""));
  }
  return pieces(text, hex).map((piece) => piece.byte !== undefined ? byteSpan(piece.byte)
    : document.createTextNode(piece.text.replace(/\n/g, "↵\n")));
}

// A table whose cells carry their column's name, so that on a narrow screen each
// row can be laid out as a card with every column still shown (style.css).
export function labelled(table) {
  const heads = [...table.tHead.rows[0].cells].map((c) => c.dataset.label ?? c.textContent);
  for (const row of table.tBodies[0].rows) {
    [...row.cells].forEach((td, i) => { if (heads[i] !== undefined && td.dataset.label === undefined) td.dataset.label = heads[i]; });
  }
  return table;
}

export const placeholder = (text) => h("p", { class: "placeholder", text });

// --- errors and status ---
export function showError(e) {
  const el = $("error");
  if (!el) return;
  el.replaceChildren(h("strong", { text: "Error: " }), document.createTextNode(e && e.message ? e.message : String(e)));
  el.classList.add("shown");
}
// An error shown by the control that failed, not in the page's banner (on a phone that is far
// above it): kept by the control's name until it succeeds or fails again, so a re-render keeps it.
const local = new Map();
export function failAt(name, e) { local.set(name, e && e.message ? e.message : String(e)); }
export function clearAt(name) { local.delete(name); }
export function errorAt(name) {
  const m = local.get(name);
  return m ? h("p", { class: "local-error", role: "alert", dataset: { for: name } }, h("strong", { text: "Error: " }), m) : "";
}
export function clearError() {
  const el = $("error");
  if (!el) return;
  el.replaceChildren();
  el.classList.remove("shown");
}
export function setStatus(s) { $("status").textContent = s || ""; }
// One line about the text itself (it was reopened on another server), as text.
export function setNotice(s) {
  const el = $("notice");
  if (!el) return;
  el.textContent = s || "";
  el.classList.toggle("shown", !!s);
}
