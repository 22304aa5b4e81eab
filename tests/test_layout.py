"""The package's shape: no module imports another's private names, and the imports between
swattn's modules (at any depth, functions included) form no cycle."""

import ast
import pathlib

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def _modules():
    for path in sorted((SRC / "swattn").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        yield name.removesuffix(".__init__"), path


def _is_module(dotted):
    path = SRC.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _imports():
    """{module: {(imported module, name or None)}} of every swattn import in the tree."""
    graph = {}
    for module, path in _modules():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        found = graph.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = package[:len(package) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add((sub, None) if _is_module(sub) else (target, alias.name))
            elif isinstance(node, ast.Import):
                found.update((alias.name, None) for alias in node.names)
    return {m: {(t, n) for t, n in found if t.startswith("swattn")} for m, found in graph.items()}


def test_no_private_name_crosses_a_module_border():
    crossing = [f"{module} imports {target}.{name}" for module, found in _imports().items()
                for target, name in found
                if name and name.startswith("_") and not name.startswith("__") and target != module]
    assert crossing == []


def test_no_import_cycle():
    edges = {m: {t for t, _ in found if t != m} for m, found in _imports().items()}
    state = {}

    def visit(module, path):
        state[module] = "open"
        for nxt in edges.get(module, ()):
            if state.get(nxt) == "open":
                raise AssertionError(" -> ".join(path + [nxt]))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[module] = "done"

    for module in edges:
        if module not in state:
            visit(module, [module])


def test_the_checks_see_the_imports():
    graph = _imports()
    assert ("swattn.ops._gluon", "issue") in graph["swattn.ops.decode_hopper"]
    assert ("swattn.window", None) in graph["swattn.ops._common"]
    assert ("swattn.demo.main", "main") in graph["swattn.demo"]  # (inside a function)


def test_dir_lists_the_public_api():
    """dir(swattn) shows the lazily loaded API (it showed only `window`), and every name it
    lists resolves."""
    import swattn
    names = dir(swattn)
    assert {"extend_attention", "decode_attention", "plan_extend", "plan_decode"} <= set(names)
    assert all(getattr(swattn, name) is not None for name in names)
