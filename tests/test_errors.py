"""One error vocabulary: the classes the worker records and the policy reads are defined once, in
``shardline.errors``, and no module names one in a string."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import pytest

from shardline import errors

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "shardline"


def _exception_classes() -> dict[str, Path]:
    """Every exception class the package defines (a class whose name says it is one), and where."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Mismatch", "Exception")):
                found[node.name] = path
    return found


def test_no_module_names_an_error_class_in_a_string():
    """A class named in a string is renamed by nobody: the worker would record one name, the policy read another."""
    classes = _exception_classes()
    assert {"PoisonFileError", "RowCountMismatch", "UnsafeKeyError", "SetupError"} <= set(classes)
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in classes:
                wrong.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value!r}")
    assert not wrong, "\n".join(wrong)


def test_every_class_a_record_can_name_is_defined_once():
    classes = _exception_classes()
    for name in errors.RECORDED:
        assert classes[name] == PACKAGE / "errors.py", name
    duplicates = [
        p
        for p in PACKAGE.rglob("*.py")
        if p.name != "errors.py"
        and PACKAGE / "worker" in p.parents
        and any(isinstance(n, ast.ClassDef) and n.name in errors.RECORDED for n in ast.walk(ast.parse(p.read_text())))
    ]
    assert not duplicates


def test_the_permanent_file_failures_are_the_ones_the_policy_never_retries():
    permanent = {name for name in errors.RECORDED if errors.is_permanent_file_failure(name)}
    assert permanent == {
        "CorruptInputError",
        "InputSchemaError",
        "PoisonFileError",
        "RowCountMismatch",
        "TooManyRejectsError",
        "UnsafeKeyError",
    }
    # An instance's setup error fails the step by itself; as a file's error it is retried like a lost instance's.
    for name in (
        "SetupError",
        "HostSetupError",
        "ModelIntegrityError",
        "InputFormatError",
        "PredictionError",
        "LateInputError",
        "UnvouchedOutputError",
        "OutputUploadError",
        "ThrottlingError",
        None,
        "",
    ):
        assert not errors.is_permanent_file_failure(name), name


@pytest.mark.parametrize(
    "cls", [errors.SetupError, errors.ModelIntegrityError, errors.CorruptInputError, errors.InputRefused]
)
def test_a_permanent_error_says_so(cls):
    assert issubclass(cls, errors.PermanentError) and cls.permanent and issubclass(cls, errors.ShardlineError)


def test_a_host_problem_is_worth_another_attempt():
    assert issubclass(errors.HostSetupError, errors.SetupError) and not errors.HostSetupError.permanent
    assert not errors.GaveUpWaiting.permanent and not errors.PredictionError.permanent


def test_the_layers_raise_shardline_errors_that_old_callers_still_catch():
    """A ValueError turned into a Shardline error stays one: callers that caught the builtin still do."""
    from shardline.planning.attempt import AttemptRecordError
    from shardline.planning.inputs import PlanError, PlanFileError
    from shardline.s3uri import InvalidS3Uri, parse_s3_uri

    for cls in (InvalidS3Uri, PlanError, AttemptRecordError):
        assert issubclass(cls, errors.PermanentError) and issubclass(cls, ValueError), cls
    # A plan file gone or damaged was never a ValueError: no caller may read it as a bad argument of its own.
    assert issubclass(PlanFileError, errors.PermanentError) and not issubclass(PlanFileError, ValueError)
    with pytest.raises(InvalidS3Uri, match="not an s3:// URI"):
        parse_s3_uri("/local/path")


# --- the tree ------------------------------------------------------------------------------------------------------

BUILTIN_EXCEPTIONS = {
    name for name, value in vars(builtins).items() if isinstance(value, type) and issubclass(value, BaseException)
}


def _exception_bases() -> dict[str, list[str]]:
    """Every exception class of the package, by qualified name (``room.module.Class``), with its bases as qualified
    names of the package's own classes or builtin names: read from the source, no module imported."""
    classes: dict[str, tuple[str, list[str], dict[str, str]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name: f"{node.module.removeprefix('shardline.')}.{alias.name}"
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("shardline")
            for alias in node.names
        }
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                classes[f"{module}.{node.name}"] = (module, [ast.unparse(b) for b in node.bases], imported)

    def qualified(base: str, module: str, imported: dict[str, str]) -> str:
        if f"{module}.{base}" in classes:
            return f"{module}.{base}"
        if base in imported:
            return imported[base]
        if base.startswith("errors."):
            return base
        return base

    resolved = {
        name: [qualified(b, module, imported) for b in bases] for name, (module, bases, imported) in classes.items()
    }

    def is_exception(name: str, seen: tuple = ()) -> bool:
        if name in BUILTIN_EXCEPTIONS:
            return True
        return name in resolved and name not in seen and any(is_exception(b, (*seen, name)) for b in resolved[name])

    return {name: bases for name, bases in resolved.items() if is_exception(name)}


def _under(name: str, root: str, classes: dict[str, list[str]]) -> bool:
    return name == root or any(_under(b, root, classes) for b in classes.get(name, []))


def exception_tree() -> list[str]:
    """The package's exceptions as the tree errors.py opens with: each under its first base of the package's own
    (its other bases after it, in brackets), the signals apart."""
    classes = _exception_bases()
    children: dict[str, list[str]] = {}
    for name, bases in classes.items():
        parent = next((b for b in bases if b in classes), None)
        children.setdefault(parent or "", []).append(name)

    def short(name: str) -> str:
        return name.removeprefix("errors.")

    lines: list[str] = []

    def walk(name: str, depth: int) -> None:
        others = [short(b) for b in classes[name][1:]]
        lines.append("    " + "  " * depth + short(name) + (f" [{', '.join(others)}]" if others else ""))
        for child in sorted(children.get(name, []), key=lambda c: c.split(".")[-1]):
            walk(child, depth + 1)

    walk("errors.ShardlineError", 0)
    return lines


def test_every_exception_is_a_shardline_error_or_a_named_signal():
    classes = _exception_bases()
    stray = sorted(n for n in classes if not _under(n, "errors.ShardlineError", classes) and n not in errors.SIGNALS)
    assert not stray, f"under ShardlineError, or named in errors.SIGNALS with why: {stray}"
    assert not errors.SIGNALS - set(classes), errors.SIGNALS - set(classes)  # no name of a class that is gone
    assert not any(_under(n, "errors.ShardlineError", classes) for n in errors.SIGNALS)


def test_errors_py_opens_with_the_tree_as_it_is():
    """The tree in errors.py's docstring is the one the source makes: a class added, moved or gone changes it."""
    documented = errors.__doc__.split("The tree (", 1)[1].split("\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert documented == exception_tree(), "\n".join(exception_tree())


def test_a_quoted_text_is_clipped_saying_how_much_was_left_out():
    assert errors.clipped("short") == "short"
    assert errors.clipped("x" * errors.QUOTED_CHARS) == "x" * errors.QUOTED_CHARS
    body = "1.5,2.5\n" * 100_000
    quoted = errors.clipped(body)
    assert quoted == body[: errors.QUOTED_CHARS] + "... (798,000 more characters)"
    assert errors.clipped("abcdef", 3) == "abc... (3 more characters)"
