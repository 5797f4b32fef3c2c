"""One error vocabulary: the classes the worker records and the policy reads are defined once, in
``shardline.errors``, and no module names one in a string."""

from __future__ import annotations

import ast
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
