"""The layers the package is built in (issue 40), enforced: each package of ``src/puffergpt``
imports only the packages below it, says so in its docstring, and no module outside
``stores/`` (where each backend is one module) passes 500 lines.

Every import counts, as in test_structure.py: at module level, inside a function, under
``if TYPE_CHECKING:``. A failure names the module, the line and what it imported.
"""

from __future__ import annotations

import ast

from test_structure import PACKAGE, ROOT, imported, modules

MAX_MODULE_LINES = 500

# What each package may import besides itself, from the bottom up. "puffergpt" is the package's
# own __init__ (its version and path).
MAY_IMPORT = {
    "settings": set(),  # every server setting defined once: read by every layer, imports none
    "model": set(),  # GPT-2 as math: knows no store, no text, no edge
    "stores": {"puffergpt", "settings"},  # the vector databases: know nothing of GPT-2; settings: their own
    "texts": {"model"},  # a text reaches the searches only through the seam: never a store
    "search": {"model", "stores", "settings"},  # settings: the scheduler's and the sweeper's defaults
    "lens": {"model", "texts", "stores"},  # stores: the seam's errors (an index that isn't there)
    "app": {"model", "texts", "lens", "search", "settings"},  # settings: a request's bound
    "notebook": {"model", "texts", "lens", "app"},
    "bench": {"puffergpt", "model", "texts", "search", "stores", "app"},  # a server only over HTTP
    "mcp": {"puffergpt", "model", "texts", "lens", "search", "stores", "app", "notebook"},  # never the server
    "server": {"puffergpt", "model", "texts", "lens", "search", "stores", "app", "notebook", "settings"},  # never mcp
}
EDGES = {"cli"}  # the command line may call every layer and edge: it starts them


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (PACKAGE / parts[1]).is_dir()) else "puffergpt"


def test_every_module_lives_in_a_layer():
    """No module sits loose beside the packages: each belongs to a layer named in MAY_IMPORT."""
    loose = [m for m in modules() if package_of(m) not in {*MAY_IMPORT, *EDGES, "puffergpt"}
             or (package_of(m) == "puffergpt" and m != "puffergpt")]
    assert not loose, f"modules outside the layers (move them into a package, or add a layer here): {loose}"


def test_each_package_imports_only_the_layers_below_it():
    known = modules()
    wrong = []
    for name, path in known.items():
        pkg = package_of(name)
        if pkg not in MAY_IMPORT:
            continue
        for e in imported(name, path, known):
            target = package_of(e.target)
            if target != pkg and target not in MAY_IMPORT[pkg]:
                wrong.append(f"{path.relative_to(ROOT)}:{e.line} ({pkg}) imports {e.target} ({target})")
    assert not wrong, "imports across the layers' rules:\n" + "\n".join(wrong)


def test_the_rules_catch_a_wrong_import(tmp_path):
    """The check itself: a model module that imports a store is found, with its line."""
    known = {"puffergpt.model.x": tmp_path / "x.py", "puffergpt.stores.base": tmp_path / "base.py"}
    (tmp_path / "x.py").write_text("import os\n\n\ndef f():\n    from puffergpt.stores.base import Store\n")
    edges = imported("puffergpt.model.x", known["puffergpt.model.x"], known)
    assert [(e.target, e.line) for e in edges] == [("puffergpt.stores.base", 5)]
    assert package_of("puffergpt.stores.base") not in MAY_IMPORT["model"]


def test_server_and_mcp_never_import_each_other():
    assert "mcp" not in MAY_IMPORT["server"] and "server" not in MAY_IMPORT["mcp"]


def test_each_package_says_what_it_holds_and_may_import():
    missing = []
    for init in sorted(PACKAGE.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        if init.parent.name in MAY_IMPORT and ("May import" not in doc and "may import" not in doc):
            missing.append(f"{init.relative_to(ROOT)}: no 'May import' line")
        if len(doc) < 80:
            missing.append(f"{init.relative_to(ROOT)}: the docstring does not say what the package holds")
    assert not missing, "\n".join(missing)


def test_no_module_outside_stores_is_over_500_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted(PACKAGE.rglob("*.py"))
            if "stores" not in p.relative_to(PACKAGE).parts
            and (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {long}"
