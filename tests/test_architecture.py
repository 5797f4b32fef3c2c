"""The tree matches ARCHITECTURE.md, and its import rules hold.

The rooms table in ARCHITECTURE.md is the source: each room must exist under src/shardline/,
every room there must be in the table, a module imports only the rooms its room may import
(every import statement counts, those inside functions too), and a room never loads the
third-party modules the table forbids, checked both in its source and in a fresh interpreter
that imports every module of the room. The table holds one short line per room; the detail is the
room's docstring, which names its modules: each module it names exists, and each module is named.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "shardline"
TOP_LEVEL = {"__init__", "__main__", "provider_info"}  # the package's own top: the version, the CLI, Airflow's card


def _rooms() -> dict[str, dict[str, set[str]]]:
    text = (REPO / "ARCHITECTURE.md").read_text()
    section = text.split("## Rooms", 1)[1].split("\n## ", 1)[0]
    rooms = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and (m := re.fullmatch(r"`(\w+)`", cells[0])):
            rooms[m.group(1)] = {
                "holds": cells[1],
                "may": set(re.findall(r"\w+", cells[2])),
                "never": set(re.findall(r"\w+", cells[3])),
            }
    return rooms


ROOMS = _rooms()


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts).removesuffix(".__init__")] = path
    return found


def _room_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_the_rooms_table_parses():
    assert {
        "spec",
        "planning",
        "ledger",
        "decision",
        "backends",
        "worker",
        "orchestration",
        "local",
        "oncall",
        "airflow",
    } <= set(ROOMS), ROOMS
    for room, rule in ROOMS.items():
        assert rule["may"] <= set(ROOMS), f"{room} may import {rule['may'] - set(ROOMS)}, which are no rooms"


def test_the_tree_has_exactly_the_rooms_of_architecture_md():
    present = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py")
    }
    assert present - TOP_LEVEL == set(ROOMS), (present - TOP_LEVEL) ^ set(ROOMS)


def _room_imports():
    """(module, its room, an imported name) for every import statement of every room's module."""
    for module, path in _modules().items():
        room = _room_of(module)
        if room not in TOP_LEVEL:
            for name in _imports(path):
                yield module, room, name


def test_every_import_goes_one_way():
    wrong = [
        f"{module} imports {name} ({room} may import {sorted(ROOMS[room]['may'])})"
        for module, room, name in _room_imports()
        if name.startswith("shardline.")
        and (target := name.split(".")[1]) in ROOMS
        and target != room
        and target not in ROOMS[room]["may"]
    ]
    assert not wrong, "\n".join(wrong)


def test_the_rooms_import_none_of_their_forbidden_libraries_in_source():
    wrong = [
        f"{module} imports {name}"
        for module, room, name in _room_imports()
        if name.split(".")[0] in ROOMS[room]["never"]
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("room", sorted(r for r in ROOMS if ROOMS[r]["never"]))
def test_importing_a_room_loads_none_of_its_forbidden_libraries(room):
    """What the source checks miss: a module of another room, imported here, that loads one."""
    modules = sorted(m for m in _modules() if _room_of(m) == room and not m.endswith("__main__"))
    code = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}:\n    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(ROOMS[room]['never'])!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr[-3000:]
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert not loaded, f"importing {room} loads {sorted({m.split('.')[0] for m in loaded})}: {loaded[:5]}"


def test_the_top_level_stays_small():
    """`shardline --version` and Airflow's provider discovery import only these: no AWS client, no Airflow."""
    code = (
        "import json, sys, shardline, shardline.provider_info\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('airflow', 'boto3', 'botocore', 'pynamodb', 'pyarrow', 'numpy'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert json.loads(result.stdout) == []


def test_every_path_where_to_change_what_points_to_exists():
    section = (REPO / "ARCHITECTURE.md").read_text().split("## Where to change what", 1)[1]
    paths = re.findall(r"`([\w/]+(?:\.py|/))`", section)
    assert len(paths) >= 10, paths
    missing = [p for p in paths if not (PACKAGE / p).exists()]
    assert not missing, missing


# The rooms table holds one line per room. The detail is each room's docstring (its package's ``__init__.py``, or the
# module's own), and each subpackage's docstring names its own modules.
MAX_HOLDS_CHARACTERS = 160
MIN_DOCSTRING_CHARACTERS = 400  # a paragraph at least: a one-line docstring names no module
# How a docstring names a module: :mod:`.x`, :mod:`.x.y` (read from the docstring's package, as Python reads a relative
# import), :mod:`shardline.x.y` (or with a ``~``), or a path from the docstring's folder, `x.py` or ``sub/x.py``.
MODULE_REFERENCE = re.compile(r":mod:`~?([\w.]+)`")
PATH_REFERENCE = re.compile(r"(?<![\w/`])``?((?:\w+/)*\w+\.py)``?")


def _room_files() -> dict[str, Path]:
    return {
        room: PACKAGE / room / "__init__.py" if (PACKAGE / room).is_dir() else PACKAGE / f"{room}.py" for room in ROOMS
    }


def _docstring_files() -> list[Path]:
    """Each room's docstring file, and every subpackage's ``__init__.py`` under a room."""
    subpackages = {p for room in ROOMS if (PACKAGE / room).is_dir() for p in (PACKAGE / room).rglob("__init__.py")}
    return sorted(set(_room_files().values()) | subpackages)


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _named_modules(path: Path, doc: str | None = None) -> list[tuple[str, str]]:
    """(the reference as written, the module it names) for each module the docstring of ``path`` (or ``doc``) names."""
    doc = _docstring(path) if doc is None else doc
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rpartition(".")[0]
    named = []
    for ref in MODULE_REFERENCE.findall(doc):
        if ref == "shardline" or ref.startswith("shardline."):
            named.append((ref, ref))
        else:
            dots = len(ref) - len(ref.lstrip("."))
            base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
            named.append((ref, f"{base}.{ref.lstrip('.')}"))
    for ref in PATH_REFERENCE.findall(doc):
        relative = (path.parent / ref).relative_to(PACKAGE.parent).with_suffix("")
        named.append((ref, ".".join(relative.parts).removesuffix(".__init__")))
    return named


def _missing_modules(path: Path, doc: str | None = None) -> list[str]:
    modules = _modules()
    return [
        f"{path.relative_to(REPO)} names {ref} ({name}), which is no module"
        for ref, name in _named_modules(path, doc)
        if name not in modules
    ]


def test_each_rooms_table_cell_is_one_short_line():
    long = {room: len(rule["holds"]) for room, rule in ROOMS.items() if len(rule["holds"]) > MAX_HOLDS_CHARACTERS}
    assert not long, f"over {MAX_HOLDS_CHARACTERS} characters (the detail goes in the room's docstring): {long}"
    assert all(rule["holds"] for rule in ROOMS.values()), ROOMS


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_has_a_docstring_that_holds_its_detail(room):
    path = _room_files()[room]
    assert len(_docstring(path)) >= MIN_DOCSTRING_CHARACTERS, f"{path.relative_to(REPO)}: its docstring is too short"


def test_every_module_a_docstring_names_exists():
    files = _docstring_files()
    assert len([ref for path in files for ref in _named_modules(path)]) > 100  # it reads the references, not nothing
    missing = [line for path in files for line in _missing_modules(path)]
    assert not missing, "\n".join(missing)


def test_the_docstring_check_finds_a_module_that_is_not_there():
    pool = PACKAGE / "worker" / "pool" / "__init__.py"
    there = ":mod:`.runner`, `scheduler.py`, :mod:`..job.run`, :mod:`~shardline.worker.model.predict`"
    assert _missing_modules(pool, there) == []
    missing = _missing_modules(pool, ":mod:`.runer`, ``jobs/run.py``, :mod:`~shardline.worker.pol`, `x.py`")
    assert [line.split(" names ", 1)[1] for line in missing] == [
        ".runer (shardline.worker.pool.runer), which is no module",
        "shardline.worker.pol (shardline.worker.pol), which is no module",
        "jobs/run.py (shardline.worker.pool.jobs.run), which is no module",
        "x.py (shardline.worker.pool.x), which is no module",
    ]


def test_every_module_of_a_room_is_named_in_its_packages_docstring():
    """A reader finds each module from its package's docstring: a module added there gets a line of its own."""
    modules = _modules()
    named = {path: {name for _, name in _named_modules(path)} for path in _docstring_files()}
    unnamed = [
        f"{path.relative_to(REPO)} (not in {modules[package].relative_to(REPO)})"
        for module, path in modules.items()
        if _room_of(module) in ROOMS
        and (package := module.rpartition(".")[0]) != "shardline"
        and not module.endswith("__main__")
        and module not in named[modules[package]]
    ]
    assert not unnamed, "\n".join(unnamed)


# A container path, the temp-file marker, an instance's name being made (f"algo-{i}", "algo-2"); help text
# that names the pattern ("algo-N") is no copy.
AGREEMENTS = re.compile(r"/opt/ml/|\.shardline-tmp|algo-(\d|$)")


def _string_literals(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants and f-string parts, docstrings left out."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_what_the_orchestrator_and_the_worker_agree_on_is_written_once():
    """Container paths, instance names and the temp-file marker live in shardline.contract; a second copy
    on one side would drift from the other (the worker would write where the emulator never looks)."""
    copies = []
    for module, path in _modules().items():
        if module == "shardline.contract":
            continue
        for line, text in _string_literals(ast.parse(path.read_text())):
            if AGREEMENTS.search(text):
                copies.append(f"{module}:{line}: {text!r}")
    assert not copies, "\n".join(copies)


def _module_graph() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports (any import statement, those inside
    functions too); ``from package import module`` counts as importing that module."""
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for imported in _imports(path):
            name = imported
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and modules[name].name != "__init__.py":
                targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_modules_import_each_other_however_indirectly():
    cycles = _cycles(_module_graph())
    assert not cycles, "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The caps a reader can hold at one sitting. They are limits, not budgets: a file, class or function that grows
# to one is split along a seam of its own, not trimmed to pass.
MAX_FILE_LINES, MAX_CLASS_LINES, MAX_FUNCTION_LINES = 600, 400, 80


def _sizes() -> list[tuple[str, str, int]]:
    """Every source file, class and function of the package: (kind, where, lines)."""
    sizes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        text, where = path.read_text(), str(path.relative_to(PACKAGE))
        sizes.append(("file", where, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                kind = "class" if isinstance(node, ast.ClassDef) else "function"
                sizes.append((kind, f"{where}: {node.name}", node.end_lineno - node.lineno + 1))
    return sizes


CAPS = {"file": MAX_FILE_LINES, "class": MAX_CLASS_LINES, "function": MAX_FUNCTION_LINES}


def test_no_file_class_or_function_is_too_long_to_read_at_one_sitting():
    over = [
        f"{kind} {where} ({lines} lines, the cap is {CAPS[kind]})"
        for kind, where, lines in _sizes()
        if lines > CAPS[kind]
    ]
    assert not over, "\n".join(over)


def test_the_size_check_sees_files_classes_and_functions():
    kinds = {kind: max(lines for k, _, lines in _sizes() if k == kind) for kind in CAPS}
    assert all(lines > 40 for lines in kinds.values()), kinds  # each kind is measured, not skipped


def test_the_watch_is_called_the_watch_everywhere():
    """ARCHITECTURE.md's words: the step's watch task is never called a sensor, in the code or the docs."""
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for root in (PACKAGE, REPO / "docs")
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.suffix in (".py", ".md", ".html", ".yaml", ".json", ".js", ".css")
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if "sensor" in line.lower()
    ]
    assert found == [], found


def test_an_instance_is_called_an_instance_where_people_read():
    """ARCHITECTURE.md's words: one machine of a job is an instance. Its heartbeat's ledger item keeps the name SHARD
    (a name the tables hold), and `--shard` is an old spelling of `--instance` that still works; nothing people read
    (the docs, the on-call page, the run report's page and messages) calls an instance a shard."""
    allowed = re.compile(r"\bSHARD\b|--shard\b|calls an instance a shard")  # the item's name, the alias, this rule
    places = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").rglob("*.md"))]
    places += [
        *sorted((PACKAGE / "airflow" / "ui" / "static").glob("*")),
        PACKAGE / "report" / "render.py",
        PACKAGE / "report" / "charts.py",
        PACKAGE / "oncall" / "messages.py",
    ]
    found = [
        f"{path.relative_to(REPO)}:{number}"
        for path in places
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if re.search(r"\bshards?\b", allowed.sub("", line), re.IGNORECASE)
    ]
    assert len(places) > 10 and found == [], found


def test_a_report_is_for_people_and_an_instance_sums_up_in_a_summary():
    """ARCHITECTURE.md's words: a report is a document for people (the run report and what the tools print). The
    worker's job and pool name what they record a summary, a manifest or a FileResult, never a report."""
    import io
    import tokenize

    files = sorted((PACKAGE / "worker" / "job").glob("*.py")) + sorted((PACKAGE / "worker" / "pool").glob("*.py"))
    found = []
    for path in files:
        text = path.read_text()
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            line = token.line.lstrip()
            if token.type == tokenize.NAME and "report" in token.string.lower() and not line.startswith("from "):
                found.append(f"{path.relative_to(REPO)}:{token.start[0]}: {token.string}")
    assert len(files) > 10 and found == [], found


def test_an_outcome_is_always_the_watchs_action():
    """ARCHITECTURE.md's words: an outcome is what the watch decides about an attempt, an ``Action``. No class or
    function calls something else an outcome (a run's end is a ``RunEnd``, a file's recorded end a ``FinishedFile``),
    and a field or parameter named ``outcome`` holds an ``Action``."""
    about_the_watchs = {"outcome_message", "run_outcome_message"}  # the STEP and RUN items' words for an Action
    found, checked = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ClassDef | ast.FunctionDef) and "outcome" in node.name.lower():
                checked += 1
                if node.name not in about_the_watchs:
                    found.append(f"{where}: {node.name}")
            named = None
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                named = (node.target.id, node.annotation)
            elif isinstance(node, ast.arg):
                named = (node.arg, node.annotation)
            if named and named[0] == "outcome":
                checked += 1
                if named[1] is None or "Action" not in ast.unparse(named[1]):
                    found.append(f"{where}: outcome: {ast.unparse(named[1]) if named[1] else 'no annotation'}")
    assert checked >= 3 and found == [], found  # StepSummary.outcome, StepSummary.ended(outcome) and the messages


def test_the_airflow_tasks_import_no_on_call_code():
    """A task runs orchestration's functions; on-call's code (the CLI, the page's service) is never a task's."""
    operators = sorted((PACKAGE / "airflow" / "operators").glob("*.py"))
    assert len(operators) >= 5, operators  # the check reads the operators, not nothing
    found = {path.name: sorted(n for n in _imports(path) if n.startswith("shardline.oncall")) for path in operators}
    assert not {name: names for name, names in found.items() if names}, found
