"""What model libraries and user scripts say while they predict (``shardline.worker.model.guards``): counted per file
by shape, shown once each; and the warnings that mean a wrong input, or a model saved by another scikit-learn, fail."""

from __future__ import annotations

import logging
import sys
import warnings

import pytest

from shardline.errors import PredictionError, SetupError
from shardline.worker.model.guards import (
    MAX_DISTINCT_LINES,
    OutputTally,
    captured,
    raise_for_wrong_input,
    strict_model_load,
)


def test_lines_are_counted_by_shape_whatever_their_numbers():
    tally = OutputTally()
    for i in range(3):
        tally.add(f"batch {i} took {0.5 * i}s", notable=False)
    tally.add("Traceback-free warning: low memory")
    tally.add("   ")  # blank: nothing
    assert tally.summary() == [("batch 0 took 0.0s", 3), ("Traceback-free warning: low memory", 1)]
    assert tally.warnings() == 1  # only the notable line's occurrences
    tally.add("batch 9 took 1.5s", notable=True)  # a shape seen before becomes notable once one occurrence is
    assert tally.notable()[0] == ("batch 0 took 0.0s", 4, True) and tally.warnings() == 5


def test_past_the_distinct_lines_kept_the_rest_are_only_counted():
    tally = OutputTally()
    assert not tally
    for i in range(MAX_DISTINCT_LINES + 3):
        tally.add(f"line {'x' * i}")
    assert len(tally.summary()) == MAX_DISTINCT_LINES and tally.dropped == 3 and tally


def test_emit_logs_each_line_once_at_its_level_then_forgets_them(caplog):
    tally = OutputTally()
    tally.add("loaded 3 rows", notable=False)
    tally.add("loaded 4 rows", notable=False)
    tally.add("UserWarning: deprecated")
    with caplog.at_level(logging.INFO, logger="shardline.worker.model.guards"):
        tally.emit("part-0.parquet")
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert said == [
        (logging.INFO, "inference.py said (2 times) while processing part-0.parquet: loaded 3 rows"),
        (logging.WARNING, "inference.py said while processing part-0.parquet: UserWarning: deprecated"),
    ]
    assert not tally


def test_prints_logs_and_warnings_inside_the_block_go_to_the_tally():
    tally = OutputTally()
    root = logging.getLogger()
    before = root.handlers[:]
    with captured(tally) as caught:
        print("predicting 100 rows")
        print("cuda not found", file=sys.stderr, end="")  # flushed when the block ends
        logging.getLogger("some.library").info("routine")
        logging.getLogger("some.library").warning("odd input")
        warnings.warn("this is deprecated", DeprecationWarning, stacklevel=1)
    assert root.handlers == before  # the worker's own log is back
    assert [str(w.message) for w in caught] == ["this is deprecated"]
    assert tally.notable() == [
        ("predicting 100 rows", 1, False),
        ("INFO some.library: routine", 1, False),
        ("WARNING some.library: odd input", 1, True),
        ("cuda not found", 1, True),
    ]


def _warning(message: str, category: type[Warning] = UserWarning, filename: str = "x.py") -> warnings.WarningMessage:
    return warnings.WarningMessage(message, category, filename, 1)


FEATURE_NAMES = "X does not have valid feature names, but HistGradientBoostingClassifier was fitted with feature names"
SKLEARN_FILE = "/site-packages/sklearn/base.py"


@pytest.mark.parametrize("script", [False, True])
def test_a_feature_name_warning_fails_the_file_saying_what_to_name(script):
    with pytest.raises(PredictionError) as failed:
        raise_for_wrong_input([_warning(FEATURE_NAMES, filename=SKLEARN_FILE)], OutputTally(), None, script=script)
    said = str(failed.value)
    assert said.startswith(f"scikit-learn warned: {FEATURE_NAMES}.") and "input.features (--features)" in said
    assert ("pass a DataFrame" in said) is script


def test_a_scripts_feature_name_warning_is_only_noted_when_the_order_was_fixed():
    tally = OutputTally()
    raise_for_wrong_input([_warning(FEATURE_NAMES, filename=SKLEARN_FILE)], tally, "input.features", script=True)
    assert tally.summary() == [(f"warning UserWarning: {FEATURE_NAMES} (input.features)", 1)]


def test_a_data_conversion_warning_fails_and_any_other_warning_is_tallied():
    class DataConversionWarning(UserWarning):
        pass

    with pytest.raises(PredictionError, match="scikit-learn warned that the input was converted: to float64"):
        raise_for_wrong_input([_warning("to float64", DataConversionWarning)], OutputTally(), None, script=False)
    tally = OutputTally()
    not_sklearns = _warning(FEATURE_NAMES, filename="/my/code/inference.py")  # from the user's own code
    raise_for_wrong_input([_warning("slow path", RuntimeWarning), not_sklearns], tally, None, script=True)
    assert [line for line, _ in tally.summary()] == [
        "warning RuntimeWarning: slow path",
        f"warning UserWarning: {FEATURE_NAMES}",
    ]


def test_a_model_saved_by_another_scikit_learn_is_refused_and_other_load_warnings_logged(caplog):
    class InconsistentVersionWarning(UserWarning):
        pass

    refused = pytest.raises(SetupError, match=r"^model\.joblib was saved with another scikit-learn version than the")
    with refused, strict_model_load("model.joblib"):
        warnings.warn("Trying to unpickle estimator from version 1.0", InconsistentVersionWarning, stacklevel=1)
    with caplog.at_level(logging.INFO, logger="shardline.worker.model.guards"), strict_model_load("model.joblib"):
        warnings.warn("old format", FutureWarning, stacklevel=1)
    assert [r.getMessage() for r in caplog.records] == ["while loading model.joblib: FutureWarning: old format"]
