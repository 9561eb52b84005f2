"""Progress for the long phases: rich bars with ETA on a terminal, nothing in tests."""

from __future__ import annotations

from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class Reporter(Protocol):
    def phase(self, name: str, total: int) -> None: ...

    def advance(self, detail: str = "") -> None: ...

    def done(self) -> None: ...

    def note(self, message: str) -> None: ...


class QuietReporter:
    """Records what would have been shown (tests assert on ``notes``)."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.phases: list[tuple[str, int]] = []
        self.advanced = 0

    def phase(self, name: str, total: int) -> None:
        self.phases.append((name, total))

    def advance(self, detail: str = "") -> None:
        self.advanced += 1

    def done(self) -> None:
        return None

    def note(self, message: str) -> None:
        self.notes.append(message)


class RichReporter:
    """One bar per phase with elapsed time and ETA; notes print above the bar."""

    def __init__(self, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True, soft_wrap=True)
        self._progress: Progress | None = None
        self._task: TaskID | None = None

    def phase(self, name: str, total: int) -> None:
        self.done()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self._console,
        )
        self._progress.start()
        self._task = self._progress.add_task(name, total=total, detail="")

    def advance(self, detail: str = "") -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1, detail=detail)

    def done(self) -> None:
        if self._progress is not None:
            self._progress.stop()
        self._progress = None
        self._task = None

    def note(self, message: str) -> None:
        self._console.print(message)
