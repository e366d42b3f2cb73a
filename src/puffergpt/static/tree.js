// The branch tree: every continuation of this prompt the page has seen, forking
// where a branch put another token. Click one to go back to it.
import { goToPath } from "./actions.js";
import { $, h, placeholder } from "./dom.js";
import { S, view } from "./state.js";

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
    box.replaceChildren(placeholder("Branch from a candidate to explore another continuation; every branch you take is kept here."));
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

export function initTree() { view("tree", renderTree); }
