"""Which task the pool runs next, and what a worker's crash means: a pure state machine.

No processes and no I/O: the :class:`~shardline.worker.pool.runner.Runner` tells the :class:`Scheduler` what
happened (an event) and does what it answers (actions). The rules:

- At most ``max_inflight`` tasks are in flight; more start as each completes (pull-based backpressure).
- When a worker dies, every task that was in flight becomes a suspect. Suspects run one at a time, so
  the next crash has one culprit; nothing else starts until the last suspect has finished.
- A suspect that kills its worker while running alone is retried alone, up to ``max_crashes`` crashes;
  then its file fails as poison and the other files go on.
- A file that failed starts none of its remaining parts.
- When every part of a split file is written, the task that merges them goes to the front of the queue.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from shardline.worker.io.work_units import InputFile, WorkUnit


@dataclasses.dataclass(frozen=True)
class Merge:
    """The task that joins a split file's written parts into its output."""

    file: InputFile
    parts: tuple[str, ...]  # the parts' temporary outputs, in order

    @property
    def label(self) -> str:
        return f"{self.file.relative_path} [merge]"


Task = WorkUnit | Merge


# -- events: what happened -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RoomToStart:
    """The runner can start tasks now: the slots of the tasks in flight that finished are free."""


@dataclasses.dataclass(frozen=True)
class Finished:
    """A task came back with its result, good or bad: its worker lived."""

    task: Task


@dataclasses.dataclass(frozen=True)
class PartWritten:
    """A part of a split file was written, to ``output`` (a temporary file the merge joins)."""

    unit: WorkUnit
    output: str


@dataclasses.dataclass(frozen=True)
class FileFailed:
    """A file failed: the parts of it still queued are not started."""

    relative_path: str


@dataclasses.dataclass(frozen=True)
class Crashed:
    """A worker died and took the pool with it: ``tasks`` were in flight and never came back."""

    tasks: tuple[Task, ...]


Event = RoomToStart | Finished | PartWritten | FileFailed | Crashed


# -- actions: what the runner does ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Start:
    """Submit this task to the pool."""

    task: Task


@dataclasses.dataclass(frozen=True)
class RetryOneByOne:
    """Several tasks were in flight when a worker died: each is a suspect now, to be retried alone."""

    tasks: tuple[Task, ...]


@dataclasses.dataclass(frozen=True)
class RetryAlone:
    """A suspect killed its worker while running alone (crash ``crash`` of ``allowed``): it runs alone again."""

    task: Task
    crash: int
    allowed: int


@dataclasses.dataclass(frozen=True)
class FailAsPoison:
    """A suspect killed its worker ``crashes`` times while running alone: its file fails as poison."""

    task: Task
    crashes: int


Action = Start | RetryOneByOne | RetryAlone | FailAsPoison


@dataclasses.dataclass
class Scheduler:
    """The tasks waiting, in flight and suspected, and the crashes each suspect caused."""

    max_inflight: int
    max_crashes: int
    queue: deque[Task] = dataclasses.field(default_factory=deque)
    suspects: deque[Task] = dataclasses.field(default_factory=deque)  # waiting to be retried alone
    in_flight: set[Task] = dataclasses.field(default_factory=set)
    suspected: set[Task] = dataclasses.field(default_factory=set)  # suspects not yet finished, queued or in flight
    crashes: dict[Task, int] = dataclasses.field(default_factory=dict)  # crashes of a suspect running alone
    failed_files: set[str] = dataclasses.field(default_factory=set)
    parts_left: dict[str, int] = dataclasses.field(default_factory=dict)  # parts of a file not yet written
    part_outputs: dict[str, dict[int, str]] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_units(cls, units: list[WorkUnit], *, max_inflight: int, max_crashes: int) -> Scheduler:
        scheduler = cls(max_inflight=max_inflight, max_crashes=max_crashes, queue=deque(units))
        for unit in units:
            rel = unit.file.relative_path
            scheduler.parts_left[rel] = scheduler.parts_left.get(rel, 0) + 1
            scheduler.part_outputs.setdefault(rel, {})
        return scheduler

    @property
    def busy(self) -> bool:
        """Tasks are waiting or in flight."""
        return bool(self.queue or self.suspects or self.in_flight)

    @property
    def isolating(self) -> bool:
        """After a crash, suspects run alone so the next crash has one culprit, including the last one."""
        return bool(self.suspects) or any(task in self.suspected for task in self.in_flight)

    def handle(self, event: Event) -> list[Action]:
        if isinstance(event, RoomToStart):
            return self._start()
        if isinstance(event, Finished):
            self.in_flight.discard(event.task)
            self.suspected.discard(event.task)
        elif isinstance(event, PartWritten):
            self._part_written(event.unit, event.output)
        elif isinstance(event, FileFailed):
            self.failed_files.add(event.relative_path)
        elif isinstance(event, Crashed):
            return self._crashed(event.tasks)
        return []

    def _start(self) -> list[Action]:
        isolating = self.isolating
        source = self.suspects if isolating else self.queue
        limit = 1 if isolating else self.max_inflight
        actions: list[Action] = []
        while source and len(self.in_flight) < limit:
            task = source.popleft()
            if isinstance(task, WorkUnit) and task.file.relative_path in self.failed_files:
                continue  # another part already failed the file
            self.in_flight.add(task)
            actions.append(Start(task))
        return actions

    def _part_written(self, unit: WorkUnit, output: str) -> None:
        rel = unit.file.relative_path
        self.parts_left[rel] -= 1
        self.part_outputs[rel][unit.part] = output
        if self.parts_left[rel] == 0:
            parts = tuple(self.part_outputs[rel][i] for i in range(unit.parts))
            self.queue.appendleft(Merge(unit.file, parts))  # merge promptly: it frees disk and finishes the file

    def _crashed(self, tasks: tuple[Task, ...]) -> list[Action]:
        # Decided before the crashed tasks become suspects: was a suspect running alone?
        isolating = self.isolating
        self.in_flight.clear()  # the pool went, and every task in flight with it
        self.suspected.update(tasks)
        if isolating and len(tasks) == 1:
            task = tasks[0]
            self.crashes[task] = self.crashes.get(task, 0) + 1
            if self.crashes[task] >= self.max_crashes:
                self.failed_files.add(task.file.relative_path)
                return [FailAsPoison(task, self.crashes[task])]
            self.suspects.appendleft(task)
            return [RetryAlone(task, self.crashes[task], self.max_crashes)]
        self.suspects.extend(tasks)
        return [RetryOneByOne(tasks)]
