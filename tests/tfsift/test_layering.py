"""Imports point one way: leaves <- parallel <- planning <- pipeline <- model <- features
<- training <- cli."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "tfsift"

# A module may import modules of its own layer or of lower layers, never of higher ones.
LAYERS = {
    "tfsift.version": 0,
    "tfsift.env": 0,
    "tfsift.config": 0,
    "tfsift.state": 0,
    "tfsift.hooks": 0,  # the runtime's hooks (their registry is in the process state)
    "tfsift.logs": 0,
    "tfsift.parallel": 1,
    "tfsift.planning": 2,
    "tfsift.pipeline": 3,
    "tfsift.model": 4,
    "tfsift.sift": 5,
    "tfsift.checkpoint": 5,
    "tfsift.training": 6,
    "tfsift.cli": 7,
    "tfsift": 8,  # __init__: the public names, imported lazily
}

# Upward imports allowed by name, each with its reason; nothing else may point upward.
ALLOWED_UPWARD = {
    # DistributedModel.compile/fit/evaluate/predict import the training loops lazily,
    # inside the methods, so that `model.fit` exists on the model class (Keras' API)
    # while the loops, which use sifting (layer 5), live above the model.
    ("tfsift.model", "tfsift.training"),
}


def layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return LAYERS[".".join(parts[:n])]
    raise AssertionError(f"{module} is in no layer; add its package to LAYERS")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def run_time_imports(tree: ast.AST) -> list[str]:
    """Every module imported outside ``if TYPE_CHECKING:`` blocks (function bodies too)."""
    found: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from a import b` imports module a.b when there is one, else a name of a
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.append(sub if is_module(sub) else node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def edges() -> list[tuple[str, str]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        importer = module_name(path)
        for imported in run_time_imports(ast.parse(path.read_text(), str(path))):
            if imported.split(".")[0] == "tfsift":
                out.append((importer, imported))
    return out


def is_module(name: str) -> bool:
    path = ROOT / Path(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{importer} (layer {layer(importer)}) imports {imported} (layer {layer(imported)})"
        for importer, imported in edges()
        if layer(imported) > layer(importer) and (importer, imported) not in ALLOWED_UPWARD
    ]
    assert upward == []


def test_the_allowed_upward_imports_are_lazy() -> None:
    """An allowed upward import runs only inside a function, never when the module loads."""
    for importer, imported in sorted(ALLOWED_UPWARD):
        path = ROOT / Path(*importer.split(".")).with_suffix(".py")
        module = ast.parse(path.read_text())
        outside = [
            imp
            for imp in run_time_imports(
                ast.Module(body=_module_level(module.body), type_ignores=[])
            )
            if imp == imported or imp.startswith(imported + ".")
        ]
        assert outside == [], f"{importer} imports {imported} at import time"
        assert imported in run_time_imports(module), f"{importer} no longer imports {imported}"


def _module_level(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements run when the module loads: class bodies, but no function bodies."""
    out: list[ast.stmt] = []
    for stmt in body:
        if isinstance(stmt, ast.ClassDef):
            out.extend(_module_level(stmt.body))
        elif not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(stmt)
    return out


def test_the_checker_sees_an_upward_import() -> None:
    tree = ast.parse("import tfsift.model\nif TYPE_CHECKING:\n    import tfsift.cli\n")
    assert run_time_imports(tree) == ["tfsift.model"]
    assert layer("tfsift.model") > layer("tfsift.pipeline.step")


@pytest.mark.parametrize("package", ["parallel", "planning", "pipeline", "training", "cli"])
def test_every_module_of_a_package_has_a_one_line_docstring(package: str) -> None:
    for path in sorted((PACKAGE / package).glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        assert doc, f"{path} has no module docstring"


def test_partitioner_never_imports_tfsift() -> None:
    for path in sorted((ROOT / "partitioner").rglob("*.py")):
        imported = run_time_imports(ast.parse(path.read_text()))
        assert [m for m in imported if m.split(".")[0] == "tfsift"] == [], path


def test_sifts_core_reaches_its_experimental_part_only_when_a_config_asks() -> None:
    """``tfsift.sift.experimental`` (early exit, overlap) is imported by no module when it
    loads, and lazily only by sifting's core (``transform``: ``scorer="early_exit"``)."""
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name.startswith("tfsift.sift.experimental"):
            continue
        module = ast.parse(path.read_text())
        at_load = run_time_imports(ast.Module(body=_module_level(module.body), type_ignores=[]))
        anywhere = run_time_imports(module)
        assert not [m for m in at_load if m.startswith("tfsift.sift.experimental")], name
        if not name.startswith("tfsift.sift"):
            assert not [m for m in anywhere if m.startswith("tfsift.sift.experimental")], name


def test_the_experimental_part_reaches_the_runtime_through_its_hooks_only() -> None:
    """No attribute written on the model for the planner, no process state for the executor:
    ``tfsift.hooks`` (documented and tested in tests/tfsift/test_hooks.py) instead."""
    for path in sorted((PACKAGE / "sift" / "experimental").glob("*.py")):
        text = path.read_text()
        imported = run_time_imports(ast.parse(text))
        assert "tfsift.state" not in imported, path
        assert "._tfsift" not in text, path
    assert "_tfsift." not in (PACKAGE / "planning" / "bounds.py").read_text()
