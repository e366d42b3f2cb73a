"""The shape of the house: no import circles, short functions, a README read in one sitting,
links that lead somewhere. Each failure names the place to fix (module, file:line, link).

Every import counts toward a circle: at module level, inside a function, under `if TYPE_CHECKING:`.
An import moved into a function (or behind TYPE_CHECKING) only hides a circle from the
interpreter; the two modules still each need the other to be read, tested or replaced. Importing
`puffergpt.stores.base` does not count as importing `puffergpt.stores` (the package's
`__init__`): Python runs it, but a package that re-exports its modules is not a circle.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "puffergpt"
MAX_FUNCTION_LINES = 100
MAX_README_LINES = 200


# --- import circles ------------------------------------------------------------------------

def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@dataclass(frozen=True)
class Edge:
    target: str
    line: int


def imported(name: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The package's modules that `name` imports, anywhere in it, with the line of each import."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..stores import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from puffergpt import text` imports the module puffergpt.texts.text; `from puffergpt.texts.text
            # import Text` imports puffergpt.texts.text.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:  # `import puffergpt.stores.pgvector as p` -> that module
                t = t.rpartition(".")[0]
            if t and t != name:
                edges.append(Edge(t, node.lineno))
    return edges


def circles(graph: dict[str, list[Edge]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each as a list of names."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for e in graph[v]:
            if e.target not in index:
                visit(e.target)
                low[v] = min(low[v], low[e.target])
            elif e.target in on_stack:
                low[v] = min(low[v], index[e.target])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def one_cycle(graph: dict[str, list[Edge]], comp: list[str]) -> list[tuple[str, Edge]]:
    """A shortest path from comp's first module back to itself inside comp: [(module, edge to next)]."""
    inside, start = set(comp), comp[0]
    prev: dict[str, tuple[str, Edge]] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in graph[v]:
                if e.target in inside and e.target not in prev:
                    prev[e.target] = (v, e)
                    nxt.append(e.target)
        if start in prev:
            break
        frontier = nxt
    path, v = [], start
    while True:
        u, e = prev[v]
        path.append((u, e))
        v = u
        if v == start:
            return path[::-1]


def test_no_import_circles_among_the_package_modules():
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert "puffergpt.model.reference" in graph and graph["puffergpt.search.engine"], "the import graph came out empty"
    described = []
    for comp in circles(graph):
        steps = [f"{u} ({known[u].relative_to(ROOT)}:{e.line}) imports {e.target}" for u, e in one_cycle(graph, comp)]
        described.append(f"{' <-> '.join(comp)}: " + "; ".join(steps))
    assert not described, "import circles:\n" + "\n".join(described)


def test_the_circle_finder_finds_one_through_a_function_level_import(tmp_path):
    """The finder itself, on a made-up graph: a -> b at module level, b -> a inside a function."""
    graph = {"a": [Edge("b", 1)], "b": [Edge("c", 2), Edge("a", 9)], "c": [], "d": [Edge("a", 3)]}
    assert circles(graph) == [["a", "b"]]
    assert [(u, e.target) for u, e in one_cycle(graph, ["a", "b"])] == [("a", "b"), ("b", "a")]
    src = tmp_path / "puffergpt"
    src.mkdir()
    (src / "b.py").write_text("import os\n\ndef f():\n    from puffergpt import a  # hidden in a function\n")
    edges = imported("puffergpt.b", src / "b.py", {"puffergpt.a": src / "a.py", "puffergpt.b": src / "b.py"})
    assert edges == [Edge("puffergpt.a", 4)]


# --- function length -----------------------------------------------------------------------

def test_no_function_over_100_lines_in_src():
    """Every def, methods and nested functions included, from its `def` line to its last line."""
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append((n, f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {n} lines"))
    worst_first = [s for _, s in sorted(long, reverse=True)]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(worst_first)


# --- the README and docs/ ------------------------------------------------------------------

def test_the_readme_is_read_in_one_sitting():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES}): move reference to docs/"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")
INLINE_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def links(text: str) -> list[str]:
    """The targets of a Markdown file's links, outside code blocks and code spans."""
    prose = CODE.sub("", FENCE.sub("", text))
    return INLINE_LINK.findall(prose) + REFERENCE_LINK.findall(prose)


def anchors(text: str) -> set[str]:
    """GitHub's ids for a file's headings: lower case, punctuation dropped, spaces to hyphens."""
    ids, seen = set(), {}
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def test_links_in_the_readme_and_docs_lead_somewhere():
    """Every relative link in README.md and docs/*.md names a file (or folder) that exists, and a
    #section of a Markdown file names one of its headings."""
    broken, seen = [], 0
    for md in markdown_files():
        for target in links(md.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:: not ours to check
                continue
            seen += 1
            file, _, section = target.partition("#")
            dest = (md.parent / file).resolve() if file else md
            where = f"{md.relative_to(ROOT)}: ({target})"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif section and dest.suffix == ".md" and section not in anchors(dest.read_text()):
                broken.append(f"{where}: {dest.name} has no heading #{section}")
    assert seen > 0, "no relative links found: the link parser is broken"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_page_under_docs_is_linked_from_the_readme_or_another_page():
    linked = {(md.parent / t.partition("#")[0]).resolve() for md in markdown_files() for t in links(md.read_text())}
    orphans = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages no one links to (add them to README.md's 'Where to read on'): {orphans}"


def test_the_link_parser_skips_code_and_finds_reference_links():
    text = "See [a](docs/a.md#x) and `[b](no.md)`.\n```\n[c](no.md)\n```\n[d]: docs/d.md\n"
    assert links(text) == ["docs/a.md#x", "docs/d.md"]
    assert anchors("# How a `matrix` multiply becomes a search\n## Tests\n## Tests\n") == {
        "how-a-matrix-multiply-becomes-a-search", "tests", "tests-1"}


def test_the_notebook_is_a_package_of_modules_under_400_lines():
    """The notebook split along its own parts (issue 36): a package, no module over 400 lines."""
    import puffergpt.notebook

    folder = PACKAGE / "notebook"
    assert hasattr(puffergpt.notebook, "__path__") and (folder / "__init__.py").is_file(), "notebook is not a package"
    assert not (PACKAGE / "notebook.py").exists(), "src/puffergpt/notebook.py would shadow the package"
    sizes = {p.name: len(p.read_text().splitlines()) for p in sorted(folder.glob("*.py"))}
    assert len(sizes) >= 4, sizes  # its parts, not one module renamed
    assert not {n: k for n, k in sizes.items() if k > 400}, f"notebook modules over 400 lines: {sizes}"


# --- the seams say what they carry (issue 36) --------------------------------------------

def imports_of(module: str) -> set[str]:
    known = modules()
    return {e.target for e in imported(module, known[module], known)}


def test_the_engine_names_documents_through_the_document_scheme_not_the_loader():
    """engine.py asks documents.py where rows live; it never imports the loader, the check or
    the manifest (which imports it: ``manifest.open_engine`` hands it a checked manifest)."""
    loader = {"puffergpt.search.load", "puffergpt.search.verify", "puffergpt.search.manifest"}
    assert not loader & imports_of("puffergpt.search.engine")
    assert "puffergpt.search.documents" in imports_of("puffergpt.search.engine")


def test_a_text_knows_nothing_of_inspection():
    """Inspection is a layer over a text (inspector.py): text.py imports neither its views."""
    got = imports_of("puffergpt.texts.text") & {"puffergpt.lens.inside", "puffergpt.lens.attribution",
                                               "puffergpt.lens.inspector"}
    assert not got, f"text.py imports {sorted(got)}: inspection belongs in inspector.py"


RUN_PARTS = re.compile(r"\b(weights|session|run|products)\b")  # a text's run, its two halves, the old name


def test_no_caller_probes_a_run_for_what_it_has():
    """The two seams declare everything their callers use (``reference.Weights``,
    ``session.Session``): no getattr/hasattr on a run, its weights or its session in src/."""
    probes = []
    for p in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            probe = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr",
                                                                                                        "hasattr")
            if probe and node.args and RUN_PARTS.search(ast.unparse(node.args[0])):
                probes.append(f"{p.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not probes, "probing a run instead of declaring it in its seam:\n" + "\n".join(probes)


def members(cls) -> set[str]:
    """A class's public names: its methods and properties, and the attributes it annotates."""
    return {n for n in vars(cls) if not n.startswith("_")} | set(getattr(cls, "__annotations__", {}))


def methods(cls) -> set[str]:
    return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}


def test_the_math_seam_is_the_weights_products_and_nothing_of_how_they_run():
    """``Weights`` (what the forward pass takes) is the weights' products and what describes
    them; every runtime member (requests, turns, the text's namespace of keys) is the
    ``Session``'s, beside it. numpy's weights have the products and nothing else; its session,
    ``Local``, the session's members and nothing else; the engine's weights none of the session's."""
    from puffergpt.model.reference import NumpyWeights, Weights
    from puffergpt.model.session import Local, Session
    from puffergpt.search.session import SearchSession
    from puffergpt.search.weights import SearchWeights

    products = {"embed", "norm", "linear", "attention_scores", "top_k", "top_k_many", "logits", "token_logits", "row",
                "token_rows", "cosine_all"}
    assert members(Weights) == products | {"config", "untrained"}
    assert members(Session) == {"keys_ns", "recording", "slot", "stepping", "wrote_token", "key_counts", "touch",
                                "close"}
    assert methods(NumpyWeights) == products
    assert members(Local) == members(Session)
    assert not members(Session) & (methods(SearchWeights) | members(Weights))
    assert methods(SearchSession) & members(Session) == methods(Session) and not methods(SearchSession) & products


def test_model_imports_nothing_above_it_and_texts_only_model():
    """``model/`` is the bottom layer: both seams live there because a text (``texts/``) and the
    engine (``search/``) import only it. A text never imports a store or the engine."""
    known = modules()
    above = {m: sorted(t for t in imports_of(m) if not t.startswith("puffergpt.model"))
             for m in known if m.startswith("puffergpt.model")}
    assert not any(above.values()), {m: t for m, t in above.items() if t}
    beside = {m: sorted(t for t in imports_of(m) if not t.startswith(("puffergpt.model", "puffergpt.texts")))
              for m in known if m.startswith("puffergpt.texts")}
    assert not any(beside.values()), {m: t for m, t in beside.items() if t}


def test_nothing_rewires_an_engine_after_it_is_built():
    """The engine is built complete (its scheduler passed to the constructor): no module
    assigns ``engine.scheduler`` or ``batcher.replicas`` from outside engine.py."""
    found = []
    for p in sorted(PACKAGE.rglob("*.py")):
        if p.name == "engine.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            for t in node.targets if isinstance(node, ast.Assign) else []:
                if (isinstance(t, ast.Attribute) and t.attr in ("scheduler", "replicas", "batcher")
                        and ast.unparse(t.value) != "self"):  # an object setting its own is building itself
                    found.append(f"{p.relative_to(ROOT)}:{node.lineno} {ast.unparse(t)} = ...")
    assert not found, "\n".join(found)


# --- the edges (issue 40): one protocol, no math, no leaning on each other -----------------

EDGES = ("server", "mcp", "cli")


def modules_under(package: str) -> list[str]:
    return [m for m in modules() if m == f"puffergpt.{package}" or m.startswith(f"puffergpt.{package}.")]


def test_the_server_and_mcp_never_import_each_other():
    """Both are edges over the application layer (``app/protocol.py`` holds what they share):
    no module of one imports a module of the other, at module level or inside a function."""
    known = modules()
    found = []
    for package, other in (("server", "mcp"), ("mcp", "server")):
        names = modules_under(package)
        assert len(names) > 2, f"no modules found under puffergpt.{package}"
        for name in names:
            for e in imported(name, known[name], known):
                if e.target == f"puffergpt.{other}" or e.target.startswith(f"puffergpt.{other}."):
                    found.append(f"{known[name].relative_to(ROOT)}:{e.line} imports {e.target}")
    assert not found, "an edge leans on another (move what they share to app/protocol.py):\n" + "\n".join(found)


ALWAYS_MATH = {"softmax", "log_softmax", "logsumexp", "logaddexp", "exp", "exp2", "expm1",  # whatever they're called on
               "candidates", "logprobs"}  # a Step's: its softmax (sampling.probabilities), its logit - logz
MODULE_MATH = ALWAYS_MATH | {"log", "log1p", "log2", "log10", "probabilities", "distribution"}  # of these modules:
MATH_MODULES = ("numpy", "math", "cmath", "scipy", "torch", "puffergpt.model.sampling", "puffergpt.model.reference")


def import_aliases(tree: ast.AST) -> dict[str, str]:
    """What each imported name stands for: ``np`` -> numpy, ``F`` -> torch.nn.functional, ``e`` -> math.exp."""
    names = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                names[a.asname or a.name.partition(".")[0]] = a.name if a.asname else a.name.partition(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                names[a.asname or a.name] = f"{node.module}.{a.name}"
    return names


def dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def math_calls(source: str) -> list[tuple[int, str]]:
    """Calls of a softmax, an exponential or a logarithm in ``source``, imported names resolved:
    ``np.exp(x)``, ``scipy.special.softmax(x)``, ``F.log_softmax(x)``, ``x.exp()``,
    ``sampling.probabilities(l, t)``, ``exp(x)`` after ``from math import exp``, and the methods of a
    ``Step`` that compute (``step.candidates(1.0)``, ``step.logprobs(k)``); sorted by line."""
    tree = ast.parse(source)
    names, found = import_aliases(tree), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = dotted(node.func)
        if name is None:  # a call on a call's result: f(x).exp()
            if isinstance(node.func, ast.Attribute) and node.func.attr in ALWAYS_MATH:
                found.append((node.lineno, ast.unparse(node.func)))
            continue
        head, _, rest = name.partition(".")
        full = names.get(head, head) + (f".{rest}" if rest else "")
        module, _, last = full.rpartition(".")
        of_math = any(module == m or module.startswith(f"{m}.") for m in MATH_MODULES)
        if ALWAYS_MATH & set(full.split(".")) or (last in MODULE_MATH and of_math):  # np.logaddexp.reduce too
            found.append((node.lineno, ast.unparse(node.func)))
    return sorted(found)


def test_the_math_finder_finds_softmax_and_exp_however_imported():
    source = ("import numpy as np\nimport math\nimport scipy.special\nfrom math import exp as e\n"
              "from torch.nn import functional as F\nfrom puffergpt.model import sampling\n"
              "from puffergpt.model.sampling import probabilities\nimport logging\nlog = logging.getLogger()\n"
              "def f(x, step):\n"
              "    a = np.exp(x) / np.exp(x).sum()\n"  # 11: two
              "    b = scipy.special.softmax(x)\n"
              "    c = F.log_softmax(x)\n"
              "    d = e(1.0) + math.log(2.0)\n"  # 14: two
              "    g = sampling.probabilities(x, 1.0) + probabilities(x, 1.0)\n"  # 15: two
              "    h = x.exp() + np.logaddexp.reduce(x) + np.round(x, 6) + math.floor(2.5)\n"  # 16: not round, floor
              "    log.info('fine'); log.log(10, 'fine')\n"
              "    return (x * 2).exp(), step.candidates(1.0), step.logprobs(5)\n")
    assert [line for line, _ in math_calls(source)] == [11, 11, 12, 13, 14, 14, 15, 15, 16, 16, 18, 18, 18]


def test_the_edges_render_and_compute_nothing():
    """No module under server/, mcp/ or cli/ calls a softmax, an exponential or a logarithm (nor
    a Step's methods that run them):
    the numbers come computed from the application layer (``app/protocol.py`` puts them in
    shape), and an edge only renders them."""
    found = []
    for package in EDGES:
        for path in sorted((PACKAGE / package).rglob("*.py")):
            found += [f"{path.relative_to(ROOT)}:{line} {call}(...)" for line, call in math_calls(path.read_text())]
    assert not found, "math in an edge (compute it in the application layer):\n" + "\n".join(found)
