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
    "webhooks": 4,
    "monitoring": 4,
    "workflows": 4,
    "backfills": 4,
    "admin": 5,
    "management": 5,
    "templatetags": 5,
}
#: ``waiting`` and ``tables`` hold the waits', the workflows', the outbound webhooks' and flow
#: control's tables: leaves beside ``models`` (which is at the line limit).
LEAVES = {
    "errors",
    "conf",
    "extras",
    "models",
    "task_jobs",
    "telemetry",
    "tracing",
    "waiting",
    "tables",
}
#: Leaves that are folders of modules (tables beside ``models``).
LEAF_FOLDERS = {"tables"}
WIRING = {"__init__", "apps", "checks", "urls"}
#: Imports across one layer's folders, each one way only.
SIDEWAYS = {
    ("schedules", "tasks"),  # a schedule may run a django.tasks task
    ("monitoring", "schedules"),  # the schedules' next and last occurrence are metrics
    ("monitoring", "backfills"),  # a backfill's progress and stall are metrics
    ("workflows", "tasks"),  # a workflow's job may be a django.tasks task
}


#: Who may import ``store``: the ledger (the store's only client), and the wiring that sets it
#: up (the app config prepares each connection; the checks ask whether the database is one
#: we run on). Migrations load the stored functions, and are not read here.
STORE_USERS = {"ledger", "apps", "checks"}
#: The longest module of the package, in lines: a room that outgrows it needs rooms of its own.
MAX_MODULE_LINES = 600


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
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


def wrong_way(known: dict[str, Path]) -> list[str]:
    """Imports against the layering (a folder importing a higher one, or sideways)."""
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
                    wrong.append(f"{path.name}:{line} ({name}) imports {reached}")
    return wrong


def store_reaches(known: dict[str, Path]) -> list[str]:
    """Imports of ``store`` from outside the ledger: every transition goes through the ledger."""
    return [
        f"{path.name}:{line} ({name}) imports {reached}"
        for name, path in known.items()
        if folder(name) not in STORE_USERS | {"store"}
        for target, names, line, _ in imports(name, path)
        for reached in resolve(target, names, known)
        if folder(reached) == "store"
    ]


def private_reaches(known: dict[str, Path]) -> list[str]:
    return [
        f"{path.name}:{line} ({name}) takes {target}.{n}"
        for name, path in known.items()
        for target, names, line, _ in imports(name, path)
        for n in names
        if n.startswith("_") and target != name
    ]


def loops(known: dict[str, Path]) -> list[str]:
    """Imports inside functions count too: a loop broken by a late import is still a loop."""
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
    return sorted(set(cycles))


def test_folders_import_downward_only() -> None:
    wrong = wrong_way(modules())
    assert wrong == [], "imports against the layering:\n" + "\n".join(wrong)


def test_only_the_ledger_imports_the_store() -> None:
    wrong = store_reaches(modules())
    assert wrong == [], "go through a ledger function instead:\n" + "\n".join(wrong)


def test_no_module_takes_another_modules_private_names() -> None:
    wrong = private_reaches(modules())
    assert wrong == [], "\n".join(wrong)


def test_no_import_loops() -> None:
    cycles = loops(modules())
    assert cycles == [], "import loops:\n" + "\n".join(cycles)


def test_no_module_outgrows_its_room() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): n
        for path in modules().values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"modules over {MAX_MODULE_LINES} lines: split them by concern"


#: A package that breaks each rule once (the rules are proven to catch what they exist for).
BROKEN = {
    "__init__.py": "",
    "errors.py": "",
    "store/__init__.py": "",
    "ledger/__init__.py": "from ..runtime import worker\n",  # upward
    "ledger/rules.py": "from ..store import store\n",  # the ledger may
    "runtime/__init__.py": "",
    "runtime/worker.py": "from ..store import store\nfrom . import loop_a\n",
    "runtime/loop_a.py": "def f():\n    from . import loop_b\n",  # a late import still loops
    "runtime/loop_b.py": "from .worker import _private\nfrom . import loop_a\n",
}


def test_the_rules_catch_a_wrong_way_import_a_store_reach_a_private_name_and_a_loop(
    tmp_path: Path,
) -> None:
    package = tmp_path / "feishu_inbox"
    for relative, text in BROKEN.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text, encoding="utf-8")
    known = modules(package)
    assert wrong_way(known) == [
        "__init__.py:1 (feishu_inbox.ledger) imports feishu_inbox.runtime.worker"
    ]
    assert store_reaches(known) == [
        "worker.py:1 (feishu_inbox.runtime.worker) imports feishu_inbox.store"
    ]
    assert private_reaches(known) == [
        "loop_b.py:1 (feishu_inbox.runtime.loop_b) takes feishu_inbox.runtime.worker._private"
    ]
    assert (
        "feishu_inbox.runtime.loop_a -> feishu_inbox.runtime.loop_b -> feishu_inbox.runtime.loop_a"
        in loops(known)
    )


@pytest.mark.parametrize("capability", sorted(LAYERS))
def test_each_capability_is_a_folder(capability: str) -> None:
    assert (PACKAGE / capability / "__init__.py").is_file()


def test_the_top_level_holds_djangos_places_and_leaves_only() -> None:
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert set(top) == (LEAVES - LEAF_FOLDERS) | WIRING, top
    assert len(top) <= 12
