"""docs/api.md and the docstrings: every public name documented, the reference up to date."""

from __future__ import annotations

import ast
import dataclasses
import difflib
import importlib.util
import inspect
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "api_docs.py"
API_MD = ROOT / "docs" / "api.md"
REGENERATE = "run .venv/bin/python scripts/api_docs.py"


@pytest.fixture(scope="module")
def api_docs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("api_docs", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["api_docs"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(api_docs: ModuleType) -> str:
    return str(api_docs.render())


def own_doc(obj: Any) -> str:
    """The docstring ``obj`` has itself (``inspect.getdoc`` would take a base class's)."""
    doc = vars(obj).get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return (doc or "").strip()


def test_every_public_name_has_a_docstring(api_docs: ModuleType) -> None:
    # __version__ is a str: the reference describes it in the script's words
    names = [name for name in api_docs.public_names() if name != "__version__"]
    missing = [name for name in names if not own_doc(api_docs.public_object(name))]
    assert missing == [], f"public names without a docstring: {missing}"


def test_every_documented_member_has_a_docstring_of_its_own(api_docs: ModuleType) -> None:
    # without one, the reference would show the docstring a Keras base class has
    missing = [
        f"{obj.__name__}.{member}"
        for obj in map(api_docs.public_object, api_docs.public_names())
        if inspect.isclass(obj)
        for member, value in api_docs.members(obj)
        if not own_doc(value)
    ]
    assert missing == [], f"public methods and properties without a docstring: {missing}"


def test_api_md_equals_the_generated_reference(generated: str) -> None:
    current = API_MD.read_text(encoding="utf-8") if API_MD.exists() else ""
    diff = list(
        difflib.unified_diff(
            current.splitlines(), generated.splitlines(), "docs/api.md", "generated", lineterm=""
        )
    )
    assert current == generated, f"docs/api.md is out of date: {REGENERATE}\n" + "\n".join(
        diff[:40]
    )


def test_every_public_name_appears_in_api_md(api_docs: ModuleType) -> None:
    text = API_MD.read_text(encoding="utf-8")
    absent = [name for name in api_docs.public_names() if f"## `tfsift.{name}`" not in text]
    assert absent == [], f"docs/api.md lacks {absent}: {REGENERATE}"


def test_every_config_key_and_sift_field_appears_in_api_md() -> None:
    import dataclasses

    from tfsift.config import Config
    from tfsift.sift.config import SiftConfig

    text = API_MD.read_text(encoding="utf-8")
    fields = [f.name for cls in (Config, SiftConfig) for f in dataclasses.fields(cls)]
    absent = [name for name in fields if f"| `{name}` |" not in text]
    assert absent == [], f"docs/api.md lacks the rows of {absent}: {REGENERATE}"


def test_check_mode_fails_on_a_stale_file_and_passes_once_written(
    api_docs: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "api.md"
    target.write_text("# stale\n", encoding="utf-8")
    monkeypatch.setattr(api_docs, "API_MD", target)
    assert api_docs.main(["--check"]) == 1
    assert target.read_text(encoding="utf-8") == "# stale\n"  # --check writes nothing
    assert api_docs.main([]) == 0
    assert api_docs.main(["--check"]) == 0


def test_google_docstring_sections_become_markdown(api_docs: ModuleType) -> None:
    doc = inspect.cleandoc(
        """Does one thing with ``x``.

        Example:
            >>> thing(1)
            2

        Args:
            x: the input,
                on two lines.
            y: another.

        Returns:
            The ``result``.
        """
    )
    assert api_docs.docstring_markdown(doc) == (
        "Does one thing with `x`.\n\n"
        "**Example:**\n\n```python\n>>> thing(1)\n2\n```\n\n"
        "**Args:**\n\n- `x`: the input, on two lines.\n- `y`: another.\n\n"
        "**Returns:** The `result`."
    )


def test_a_long_signature_is_written_one_parameter_a_line(api_docs: ModuleType) -> None:
    def short(a: int, *, b: str = "x") -> None: ...

    def long(first_parameter: int, second_parameter: str, third: float = 1.0, **rest: Any) -> int:
        return 0

    assert api_docs.signature(short, "short") == "short(a: int, *, b: str = 'x') -> None"
    assert api_docs.signature(long, "tfsift.long") == (
        "tfsift.long(\n    first_parameter: int,\n    second_parameter: str,\n"
        "    third: float = 1.0,\n    **rest: Any,\n) -> int"
    )


# Every page a user reads code from; api.md is generated from the docstrings (above).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p != API_MD)]


def code_blocks() -> list[tuple[str, str]]:
    """``(page, block)`` for every Python block of the pages."""
    return [
        (page.name, block)
        for page in PAGES
        for block in re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)
    ]


def calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls of ``name(...)`` or ``<anything>.name(...)``."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (getattr(node.func, "id", None) == name or getattr(node.func, "attr", None) == name)
    ]


def test_every_code_block_parses_and_uses_only_names_that_exist(api_docs: ModuleType) -> None:
    """The README's and docs' Python blocks: valid Python (fragments with ``...`` too), only
    public ``tfsift.<name>``s, and only keywords ``SiftConfig`` and ``tfsift.init`` take."""
    import tfsift
    from tfsift.config import Config
    from tfsift.sift.config import SiftConfig

    blocks = code_blocks()
    assert {page for page, _ in blocks} >= {"README.md", "migrating.md", "sifting.md"}
    fields = {f.name for f in dataclasses.fields(SiftConfig)}
    keys = {f.name for f in dataclasses.fields(Config)}
    public = set(api_docs.public_names())
    for page, block in blocks:
        try:
            tree = ast.parse(block)
        except SyntaxError as err:
            raise AssertionError(f"{page}: a code block is not Python: {err}\n{block}") from err
        used = set(re.findall(r"\btfsift\.(\w+)", block))
        assert used - public == set(), f"{page} uses names tfsift does not export"
        for sub in re.findall(r"\btfsift\.callbacks\.(\w+)", block):
            assert sub in tfsift.callbacks.__all__, f"{page}: tfsift.callbacks.{sub}"
        for call in calls_named(tree, "SiftConfig"):
            unknown = {k.arg for k in call.keywords if k.arg} - fields
            assert not unknown, f"{page}: SiftConfig has no field {unknown}"
        for call in calls_named(tree, "init"):
            for arg in call.args:
                if isinstance(arg, ast.Dict):
                    named = {k.value for k in arg.keys if isinstance(k, ast.Constant)}
                    assert named <= keys, f"{page}: tfsift.init has no key {named - keys}"


def headings(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings: lower case, punctuation but ``-`` and
    ``_`` dropped, spaces to ``-``; a repeated heading gets ``-1``, ``-2``..."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    for line in text.split("\n"):
        if line.startswith("#"):
            slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def test_every_link_to_a_heading_finds_it() -> None:
    """``[text](page.md#anchor)`` and ``[text](#anchor)`` in the README and docs: the page
    exists and has that heading (a renamed heading breaks links silently otherwise)."""
    broken = []
    for page in [*PAGES, API_MD]:
        text = page.read_text(encoding="utf-8")
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", text):
            dest = page.parent / target if target else page
            if not dest.is_file() or anchor not in headings(dest):
                broken.append(f"{page.name}: {target}#{anchor}")
    assert broken == []


def test_headings_get_githubs_anchors(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# A `b` (c.py --d)\n## Same\n```\n# not a heading\n```\n## Same\n")
    assert headings(page) == {"a-b-cpy---d", "same", "same-1"}
