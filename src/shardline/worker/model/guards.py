"""What model libraries and user scripts say while they predict, and which of it is an error.

- A warning that signals a silently wrong input (scikit-learn's feature-name warnings, its
  DataConversionWarning) fails the file with a message that says what to change. Other
  warnings are log lines.
- Everything else a script or library prints, logs or warns is counted per file and shown
  once per distinct line with its count, so a line printed for every batch does not drown
  the worker's log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator

from shardline.errors import PredictionError, SetupError

log = logging.getLogger(__name__)

MAX_DISTINCT_LINES = 20
_NUMBERS = re.compile(r"\d+(\.\d+)?(e[-+]?\d+)?", re.IGNORECASE)


class OutputTally:
    """Lines a script or library wrote, grouped by shape (digits ignored), with counts.

    A line is *notable* when it may signal a problem: a warning, a log record at WARNING or above, or
    a line on stderr. Prints to stdout and INFO/DEBUG log records are routine (a script logging each
    request it gets), and the preview shows them as notes, not warnings.
    """

    def __init__(self) -> None:
        self.lines: dict[str, list] = {}  # shape -> [first example, count, notable]
        self.dropped = 0

    def add(self, line: str, notable: bool = True) -> None:
        line = line.rstrip()
        if not line.strip():
            return
        shape = _NUMBERS.sub("#", line)
        entry = self.lines.get(shape)
        if entry is not None:
            entry[1] += 1
            entry[2] = entry[2] or notable
        elif len(self.lines) < MAX_DISTINCT_LINES:
            self.lines[shape] = [line, 1, notable]
        else:
            self.dropped += 1

    def __bool__(self) -> bool:
        return bool(self.lines) or self.dropped > 0

    def summary(self) -> list[tuple[str, int]]:
        return [(example, count) for example, count, _ in self.lines.values()]

    def notable(self) -> list[tuple[str, int, bool]]:
        """Each distinct line, its count, and whether it may signal a problem."""
        return [(example, count, notable) for example, count, notable in self.lines.values()]

    def warnings(self) -> int:
        """How many of the lines may signal a problem (each occurrence counted)."""
        return sum(count for _, count, notable in self.lines.values() if notable)

    def emit(self, where: str, source: str = "inference.py") -> None:
        """Log each distinct line once, with how often it came, then forget them. A notable line (a warning, a
        WARNING log record, a line on stderr) is logged at WARNING: the script's own warning stays one."""
        for example, count, notable in self.notable():
            times = f" ({count} times)" if count > 1 else ""
            level = logging.WARNING if notable else logging.INFO
            log.log(level, "%s said%s while processing %s: %s", source, times, where, example[:500])
        if self.dropped:
            log.info(
                "%s said %d more line(s) of other shapes while processing %s (not shown)", source, self.dropped, where
            )
        self.lines.clear()
        self.dropped = 0


class _TallyStream(io.TextIOBase):
    def __init__(self, tally: OutputTally, notable: bool):
        self.tally, self.pending, self.notable = tally, "", notable

    def write(self, text: str) -> int:
        self.pending += text
        *complete, self.pending = self.pending.split("\n")
        for line in complete:
            self.tally.add(line, self.notable)
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.tally.add(self.pending, self.notable)
            self.pending = ""


class _TallyHandler(logging.Handler):
    def __init__(self, tally: OutputTally):
        super().__init__()
        self.tally = tally

    def emit(self, record: logging.LogRecord) -> None:
        self.tally.add(f"{record.levelname} {record.name}: {record.getMessage()}", record.levelno >= logging.WARNING)


@contextlib.contextmanager
def captured(tally: OutputTally) -> Iterator[list[warnings.WarningMessage]]:
    """Send prints, log records and warnings raised inside the block to ``tally``.

    Yields the list of caught warnings, for :func:`raise_for_wrong_input` to judge.
    Log records of the worker's own loggers still go to the worker's log.
    """
    out, err = _TallyStream(tally, notable=False), _TallyStream(tally, notable=True)
    root = logging.getLogger()
    handler = _TallyHandler(tally)
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(min(saved_level, logging.INFO) if saved_level else logging.INFO)
    try:
        with (
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            warnings.simplefilter("always")
            yield caught
    finally:
        out.flush()
        err.flush()
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)


def _is_feature_name_warning(w: warnings.WarningMessage) -> bool:
    # scikit-learn raises these as plain UserWarnings, so the text is the only thing that
    # tells them apart: "X does not have valid feature names, but ... was fitted with feature
    # names" and "X has feature names, but ... was fitted without feature names".
    return issubclass(w.category, UserWarning) and "feature names" in str(w.message) and "sklearn" in (w.filename or "")


def _category_name(w: warnings.WarningMessage) -> str:
    return getattr(w.category, "__name__", str(w.category))


def raise_for_wrong_input(
    caught: list[warnings.WarningMessage], tally: OutputTally, order_note: str | None, *, script: bool
) -> None:
    """Fail on warnings that mean the model got the wrong input; tally the rest.

    ``order_note``: what fixed the feature order (the model's recorded names or input.features), or None when
    nothing did. Then a script that passes a bare numpy array to a model fitted on a DataFrame (scikit-learn
    warns that X has no feature names) did get the columns in that order, and the warning is noted with it.
    """
    for w in caught:
        name = _category_name(w)
        if _is_feature_name_warning(w):
            if order_note and script:
                tally.add(f"warning {name}: {w.message} ({order_note})")
                continue
            raise PredictionError(
                f"scikit-learn warned: {w.message}. It cannot check that the columns are in the order the model "
                "was fitted with, so the predictions may be wrong. "
                + (
                    "Name the model's features in training order with input.features (--features), or have the "
                    "script pass a DataFrame with the model's column names to predict()"
                    if script
                    else "Name the model's features in training order with input.features (--features)"
                )
            )
        if name == "DataConversionWarning":
            raise PredictionError(
                f"scikit-learn warned that the input was converted: {w.message}. "
                "Check the feature columns' types and input.features (--features)"
            )
        tally.add(f"warning {name}: {w.message}")


@contextlib.contextmanager
def strict_model_load(path: str) -> Iterator[None]:
    """Refuse a pickled scikit-learn model saved by another scikit-learn version.

    scikit-learn says such a model "might lead to breaking code or invalid results"; a
    batch job must not find out which by writing the results.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for w in caught:
        if _category_name(w) == "InconsistentVersionWarning":
            import sklearn

            raise SetupError(
                f"{path} was saved with another scikit-learn version than the image's {sklearn.__version__}: "
                f"{w.message} Re-save the model with scikit-learn {sklearn.__version__}, or build the worker image "
                "with the version the model was saved with"
            )
        # Anything else said while loading is shown once, not lost.
        log.info("while loading %s: %s: %s", path, _category_name(w), w.message)
