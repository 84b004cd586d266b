"""The package's layout holds: arrows between its folders run one way, no module imports
another's private names, and no import loops (README "How it is built").

Read from the source (every import statement, those inside functions too), so a new import
that breaks the layering fails here, not in a reader's head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

# No test database here (a SQLite file of its own at most): the SQLite suite runs it once.
pytestmark = pytest.mark.any_database

PACKAGE = Path(__file__).resolve().parents[2] / "feishu_inbox"

#: Each folder's layer: a module may import its own folder and lower layers only.
#: The top-level leaves (errors, conf, models, task_jobs) are below everything; the top-level
#: wiring (the package's API, apps, checks, urls) may import anything.
LAYERS = {
    "store": 1,
    "ledger": 2,
    "runtime": 3,
    "feishu": 4,
    "schedules": 4,
    "tasks": 4,
    "monitoring": 4,
    "admin": 5,
    "management": 5,
    "templatetags": 5,
}
LEAVES = {"errors", "conf", "models", "task_jobs", "telemetry", "tracing"}
WIRING = {"__init__", "apps", "checks", "urls"}
#: Imports across one layer's folders, each one way only.
SIDEWAYS = {
    ("schedules", "tasks"),  # a schedule may run a django.tasks task
    ("monitoring", "schedules"),  # the schedules' next and last occurrence are metrics
}


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[0] == "migrations":
            continue
        name = ".".join(("feishu_inbox", *parts))
        found[name.removesuffix(".__init__")] = path
    return found


def imports(name: str, path: Path) -> list[tuple[str, list[str], int, bool]]:
    """(module imported, names taken from it, line, whether it runs) for each import: those
    under ``if TYPE_CHECKING:`` are for the type checker only."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for_types = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for child in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno, id(node) not in for_types) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            names = [a.name for a in node.names]
            found.append((target, names, node.lineno, id(node) not in for_types))
    return [f for f in found if f[0] == "feishu_inbox" or f[0].startswith("feishu_inbox.")]


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def resolve(target: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """The modules an import statement reaches: ``from feishu_inbox import ledger`` reaches
    ``feishu_inbox.ledger``; ``from feishu_inbox.ledger import enqueue`` the package."""
    reached = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
    return reached or [target]


def test_folders_import_downward_only() -> None:
    known = modules()
    wrong = []
    for name, path in known.items():
        here = folder(name)
        if here in WIRING:
            continue
        for target, names, line, _ in imports(name, path):
            for reached in resolve(target, names, known):
                there = folder(reached)
                if there == here or there in LEAVES:
                    continue
                if here in LEAVES:
                    allowed = there in LEAVES
                else:
                    allowed = there in LAYERS and (
                        LAYERS[there] < LAYERS[here] or (here, there) in SIDEWAYS
                    )
                if not allowed:
                    wrong.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {reached}")
    assert wrong == [], "imports against the layering:\n" + "\n".join(wrong)


def test_no_module_takes_another_modules_private_names() -> None:
    known = modules()
    wrong = [
        f"{path.relative_to(PACKAGE.parent)}:{line} takes {target}.{n}"
        for name, path in known.items()
        for target, names, line, _ in imports(name, path)
        for n in names
        if n.startswith("_") and target != name
    ]
    assert wrong == [], "\n".join(wrong)


def test_no_import_loops() -> None:
    """Imports inside functions count too: a loop broken by a late import is still a loop."""
    known = modules()
    graph = {
        name: {
            reached
            for target, names, _, runs in imports(name, path)
            if runs
            for reached in resolve(target, names, known)
            if reached in known and reached != name
        }
        for name, path in known.items()
    }
    cycles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start and len(trail) > 1:
                    cycles.append(" -> ".join([*trail, start]))
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
    assert cycles == [], "import loops:\n" + "\n".join(sorted(set(cycles)))


@pytest.mark.parametrize("capability", sorted(LAYERS))
def test_each_capability_is_a_folder(capability: str) -> None:
    assert (PACKAGE / capability / "__init__.py").is_file()


def test_the_top_level_holds_djangos_places_and_leaves_only() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(top) == LEAVES | WIRING, top
    assert len(top) <= 12
