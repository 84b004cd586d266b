"""The manual's snippets (docs/*.md and the README's front page) as a user pastes them.

``test_install.py`` runs the install steps in a fresh site; this checks every other snippet
the way a reader meets it: each Python block compiles, every name it imports from
feishu_inbox exists, every attribute it uses of ``feishu_inbox`` exists, and every
``manage.py`` command a page names (with its ``inbox`` action, and its options) is one the
site has. (The docs build itself, with warnings as errors, is part of ``make test``'s lint.)
"""

from __future__ import annotations

import ast
import re
import shlex
import textwrap
from argparse import _SubParsersAction
from importlib import import_module
from pathlib import Path
from typing import Any

import pytest
from django.core.management import get_commands, load_command_class

import feishu_inbox
from tests.support.processes import ROOT

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database

PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
BLOCK = re.compile(r"^( *)```(\w+)\n(.*?)\n\1```", re.MULTILINE | re.DOTALL)
#: A line of a shell block, or of inline code, that runs manage.py.
MANAGE = re.compile(r"(?:python|\.venv/bin/python) manage\.py ([a-z_]+)((?: [^`|;&\n#]*)?)")


def blocks(language: str) -> list[tuple[Path, str]]:
    return [
        (page, textwrap.dedent(body))
        for page in PAGES
        for _, lang, body in BLOCK.findall(page.read_text())
        if lang == language
    ]


def test_the_pages_have_snippets() -> None:
    assert len(blocks("python")) >= 15 and len(blocks("sh")) >= 8


@pytest.mark.parametrize(
    ("page", "code"), blocks("python"), ids=lambda v: v.name if isinstance(v, Path) else ""
)
def test_every_python_snippet_compiles_and_names_what_exists(page: Path, code: str) -> None:
    tree = ast.parse(code, filename=str(page))  # a SyntaxError names the page and line
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("feishu_inbox"):
            module = import_module(node.module or "")
            for alias in node.names:
                assert hasattr(module, alias.name) or _is_module(f"{node.module}.{alias.name}"), (
                    f"{page.name}: from {node.module} import {alias.name}: no such name"
                )
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "feishu_inbox"
        ):
            assert hasattr(feishu_inbox, node.attr), f"{page.name}: feishu_inbox.{node.attr}"


def _is_module(name: str) -> bool:
    try:
        import_module(name)
    except ImportError:
        return False
    return True


def manage_commands() -> list[tuple[Path, str, list[str]]]:
    found = []
    for page in PAGES:
        for command, rest in MANAGE.findall(page.read_text()):
            args = shlex.split(rest.replace("…", "x"), comments=True) if rest.strip() else []
            found.append((page, command, args))
    return found


def test_every_manage_py_command_the_pages_name_exists() -> None:
    commands = get_commands()
    named = manage_commands()
    assert len(named) >= 20
    for page, command, args in named:
        assert command in commands, f"{page.name}: manage.py {command}: no such command"
        parser = load_command_class(commands[command], command).create_parser("manage.py", command)
        where = f"{page.name}: manage.py {command}"
        words = [a for a in args if not a.startswith(("-", "[", "<"))]
        while words:  # inbox ACTION, inbox schedules ACTION: down the subcommands
            subcommands = [a for a in parser._actions if isinstance(a, _SubParsersAction)]
            if not subcommands:
                break
            choices: dict[str, Any] = subcommands[0].choices  # type: ignore[assignment]
            word = words.pop(0)
            assert word in choices, f"{where} {word}: no such action"
            parser, where = choices[word], f"{where} {word}"
        options = {flag for action in parser._actions for flag in action.option_strings}
        for arg in args:
            flag = arg.strip("[]").split("=", 1)[0]
            if flag.startswith("--"):
                assert flag in options, f"{where} {flag}: no such option"


# --- the map of the package ---------------------------------------------------------------


def modules_in(package: Path) -> set[str]:
    """Every module of the package, as a path from its folder (``runtime/claimer.py``)."""
    return {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "migrations" not in path.relative_to(package).parts
    }


def modules_mapped(page: str) -> set[str]:
    """The modules the architecture page's tree names, each as a path: a line names a folder
    (``runtime/``) or a module (``claimer.py``), two spaces deeper than the folder it is in."""
    tree = page.split("```\nfeishu_inbox/\n", 1)[1].split("```", 1)[0]
    found, folders = set(), []
    for line in tree.splitlines():
        if not line.strip():
            continue
        level = (len(line) - len(line.lstrip()) - 2) // 2
        name = line.split()[0]
        if name.endswith("/"):
            folders = [*folders[:level], name.removesuffix("/")]
        elif name.endswith(".py"):
            found.add("/".join([*folders[:level], name]))
    return found


def test_the_architecture_page_names_every_module_of_the_package() -> None:
    package = ROOT / "feishu_inbox"
    mapped = modules_mapped((ROOT / "docs" / "architecture.md").read_text())
    assert sorted(modules_in(package) - mapped) == [], "modules missing from docs/architecture.md"
    assert sorted(mapped - modules_in(package)) == [], "docs/architecture.md names modules gone"


def test_every_folders_docstring_names_each_of_its_modules() -> None:
    package = ROOT / "feishu_inbox"
    unnamed = {}
    for init in sorted(package.rglob("__init__.py")):
        folder = init.parent
        if folder == package or "migrations" in folder.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        names = [p.stem for p in folder.glob("*.py") if p.stem != "__init__"]
        names += [p.name for p in folder.iterdir() if (p / "__init__.py").is_file()]
        missing = [n for n in sorted(names) if f"``{n}``" not in doc]
        if missing:
            unnamed[str(folder.relative_to(package))] = missing
    assert unnamed == {}, "name each module in its folder's docstring, as ``module``"
