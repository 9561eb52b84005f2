"""The engine the profiler talks to, in the rejection-sampler mode each phase needs.

Launch mode: vLLM starts once in the serving mode; the profiler hook switches the sampler at run
time (every guess rejected for timing, the acceptance sampler after). Without the hook the
session restarts vLLM in the wanted mode instead (each restart is timed and reported). Attach
mode: the hook if the server has it; otherwise the server is used as it is and the counters
decide whether the phase's measurements are valid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import replace
from pathlib import Path

from tabletune.profiler.engine import EngineHttp
from tabletune.profiler.errors import HookUnavailable
from tabletune.profiler.hook_protocol import SamplerMode
from tabletune.profiler.progress import Reporter
from tabletune.profiler.server import EngineSpec, RunningServer, launched
from tabletune.profiler.settings import ConnectionSettings, LaunchSettings

log = logging.getLogger("tabletune.profiler")

EngineFactory = Callable[[str], EngineHttp]


class EngineSession:
    """Owns at most one launched server at a time; ``close()`` always stops it."""

    def __init__(
        self,
        *,
        spec: EngineSpec | None,
        attach_url: str | None,
        launch: LaunchSettings,
        connection: ConnectionSettings,
        log_dir: Path,
        reporter: Reporter,
        engine_factory: EngineFactory | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (spec is None) == (attach_url is None):
            raise ValueError("give exactly one of spec (launch) or attach_url")
        self._spec = spec
        self._attach_url = attach_url
        self._launch = launch
        self._log_dir = log_dir
        self._reporter = reporter
        self._clock = clock
        self._factory = engine_factory or (lambda url: EngineHttp(url, settings=connection))
        self._stack = ExitStack()
        self._engine: EngineHttp | None = None
        self._mode: SamplerMode | None = None
        self.launches = 0
        self.start_times_s: list[float] = []
        self.hook_works: bool | None = None
        self.notes: list[str] = []
        self.log_paths: list[Path] = []

    def close(self) -> None:
        self._stack.close()
        self._engine = None

    def __enter__(self) -> EngineSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self, mode: SamplerMode) -> EngineHttp:
        assert self._spec is not None
        self.close()
        self._stack = ExitStack()
        self.launches += 1
        spec = replace(self._spec, sampler=mode)
        log_path = self._log_dir / f"vllm-{self.launches}.log"
        self.log_paths.append(log_path)
        self._reporter.note(
            f"starting vLLM (launch {self.launches}, sampler {mode.kind}); log: {log_path}"
        )
        server: RunningServer = self._stack.enter_context(
            launched(
                spec,
                settings=self._launch,
                log_path=log_path,
                healthy=_healthy_probe(self._factory),
            )
        )
        self.start_times_s.append(server.start_s)
        engine = self._stack.enter_context(_closing(self._factory(server.base_url)))
        self._engine = engine
        self._mode = mode
        return engine

    def first_log_text(self) -> str:
        """The first launch's vLLM log ('' in attach mode or when unreadable)."""
        if not self.log_paths:
            return ""
        try:
            return self.log_paths[0].read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def current(self, mode: SamplerMode) -> EngineHttp:
        """The engine as it is now; launches (in ``mode``) or attaches on first use."""
        if self._engine is None:
            if self._attach_url is None:
                return self._start(mode)
            self._engine = self._stack.enter_context(_closing(self._factory(self._attach_url)))
        return self._engine

    def try_switch(self, mode: SamplerMode) -> bool:
        """Switch the running engine to ``mode`` through the hook; False when it cannot."""
        engine = self.current(mode)
        if self._mode == mode:
            return True
        if self.hook_works is False:
            return False
        try:
            engine.set_sampler(mode)
        except HookUnavailable as error:
            self.hook_works = False
            self.notes.append(f"sampler switch unavailable: {error}")
            self._reporter.note(f"[yellow]sampler switch unavailable[/]: {error}")
            return False
        self.hook_works = True
        self._mode = mode
        return True

    def engine_in(self, mode: SamplerMode) -> EngineHttp:
        """An engine running ``mode``: switched if possible, else restarted in that mode
        (launch mode) or used as it is (attach mode: the phase's own checks decide)."""
        if self.try_switch(mode):
            assert self._engine is not None
            return self._engine
        if self._attach_url is not None:
            assert self._engine is not None
            self.notes.append(f"attached server used as it is for the {mode.kind} phase")
            return self._engine
        return self._start(mode)


class _closing(AbstractContextManager[EngineHttp]):
    def __init__(self, engine: EngineHttp) -> None:
        self._engine = engine

    def __enter__(self) -> EngineHttp:
        return self._engine

    def __exit__(self, *exc: object) -> None:
        self._engine.close()


def _healthy_probe(factory: EngineFactory) -> Callable[[str], bool]:
    def healthy(base_url: str) -> bool:
        engine = factory(base_url)
        try:
            return engine.healthy()
        finally:
            engine.close()

    return healthy
