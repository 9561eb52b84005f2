"""The ONE glue module to vLLM internals (vLLM 0.26.x only; anywhere else it does nothing).

``register`` is the ``vllm.general_plugins`` entry point (``tabletune_engine``). vLLM runs it in
every process (API server, engine core, workers). It

1. wraps ``CudaGraphManager._init_candidates`` (the 0.26.0 start-up crash, see compat.py);
2. adds utility methods to ``EngineCore`` that the API server reaches with
   ``engine_client.engine_core.call_utility_async(name, *args)``; three read and replace
   ``Scheduler.dynamic_sd_lookup`` (index = batch size, read once per step in
   ``Scheduler.schedule``) through a pure ``EngineTableController``, one returns the step cells;
3. wraps ``Scheduler.update_from_output`` (called once per executed step, in order, on the
   engine thread) to time every step into its cell (the pure ``StepTimer``, step_timer.py), and,
   while the ``nightjar`` policy is installed, to hand each step the timer counted to the
   bandit with the tokens it kept (bandit.py); with ``TABLETUNE_STEP_TRACE`` set, it also
   writes each step's line to a trace file (step_trace.py; evaluations only).

Every vLLM import is inside a function: this module imports without vLLM installed.
Env: ``TABLETUNE_COMPAT_FIX=0`` leaves the crash in place (to show it).
"""

from __future__ import annotations

import atexit
import logging
import os
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from tabletune.admin.protocol import EngineIdentity
from tabletune.admin.state import TableState
from tabletune.plugin.bandit import NightjarLookup
from tabletune.plugin.compat import is_affected_version, wrap_init_candidates
from tabletune.plugin.controller import EngineTableController, Lookup
from tabletune.plugin.step_timer import StepTimer
from tabletune.plugin.step_trace import StepTrace, open_trace_from_env, trace_line
from tabletune.plugin.wire import GET_STEP_CELLS, GET_TABLE, PUT_SETTINGS, PUT_TABLE

LOGGER = logging.getLogger("vllm.tabletune.engine")
CONTROLLER_ATTR = "_tabletune_controller"
TIMER_ATTR = "_tabletune_step_timer"
TIMED_MARK = "_tabletune_step_timing"
TRACE_ATTR = "_tabletune_step_trace"


def register() -> None:
    import vllm

    version = str(vllm.__version__)
    if not is_affected_version(version):
        LOGGER.warning("tabletune: vLLM %s is not 0.26.x; the plugin stays inactive", version)
        return
    # An ImportError here must not take vLLM down: only the engine core needs the utilities
    # and only the model runner's process needs the fix; the log says which part is missing.
    try:
        if os.environ.get("TABLETUNE_COMPAT_FIX", "1") != "0":
            _apply_compat_fix()
        _add_engine_utilities()
        _add_step_timing()
    except ImportError as error:
        LOGGER.warning("tabletune: vLLM internals not importable here (%s); inactive", error)


def _apply_compat_fix() -> None:
    from vllm.v1.worker.gpu import cudagraph_utils

    manager = cudagraph_utils.CudaGraphManager
    manager._init_candidates = wrap_init_candidates(manager._init_candidates)


def _add_engine_utilities() -> None:
    from vllm.v1.engine.core import EngineCore

    def get_table(self: Any) -> dict[str, Any]:
        return controller_of(self).get()

    def put_table(self: Any, body: dict[str, Any], if_match: int | None) -> dict[str, Any]:
        return controller_of(self).put_table(body, if_match)

    def put_settings(self: Any, body: dict[str, Any], if_match: int | None) -> dict[str, Any]:
        return controller_of(self).put_settings(body, if_match)

    def get_step_cells(self: Any) -> dict[str, Any]:
        return step_timer_of(self.scheduler).to_wire()

    for name, method in (
        (GET_TABLE, get_table),
        (PUT_TABLE, put_table),
        (PUT_SETTINGS, put_settings),
        (GET_STEP_CELLS, get_step_cells),
    ):
        setattr(EngineCore, name, method)


def _add_step_timing() -> None:
    from vllm.v1.core.sched.scheduler import Scheduler  # AsyncScheduler inherits the method

    Scheduler.update_from_output = wrap_update_from_output(Scheduler.update_from_output)


UpdateFromOutput = Callable[[Any, Any, Any], Any]


def wrap_update_from_output(original: UpdateFromOutput) -> UpdateFromOutput:
    """``update_from_output`` that hands each step to the scheduler's ``StepTimer``: its start
    time, what was scheduled, and whether the scheduler was left without requests."""
    if getattr(original, TIMED_MARK, False):
        return original  # general plugins may load more than once per process

    @wraps(original)
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        timer = step_timer_of(self)
        trace = step_trace_of(self)
        if not timer.enabled and trace is None:
            return original(self, scheduler_output, model_runner_output)
        now = time.perf_counter()  # the step's results are ready: this call follows at once
        wall = time.time() if trace is not None else 0.0
        outputs = original(self, scheduler_output, model_runner_output)
        idle_after = not self.has_requests()
        if trace is not None:
            trace.write(step_line(wall, scheduler_output, idle_after=idle_after))
        if not timer.enabled:
            return outputs
        timed = timer.on_step(
            now,
            scheduler_output.num_scheduled_tokens,
            scheduler_output.total_num_scheduled_tokens,
            scheduler_output.scheduled_spec_decode_tokens,
            idle_after=idle_after,
            drafts_next=scheduler_output.num_spec_tokens_to_schedule,
        )
        lookup = self.dynamic_sd_lookup
        if timed is not None and isinstance(lookup, NightjarLookup):
            lookup.learn(timed.batch_size, timed.k, kept_tokens(model_runner_output), timed.seconds)
        return outputs

    setattr(update_from_output, TIMED_MARK, True)
    return update_from_output


def kept_tokens(model_runner_output: Any) -> int:
    """Tokens a step produced: per request, its accepted drafts plus the one it sampled
    (``ModelRunnerOutput.sampled_token_ids``, cut to what each request kept; a prefill chunk
    that samples nothing adds 0)."""
    return sum(map(len, model_runner_output.sampled_token_ids))


def step_line(wall_s: float, scheduler_output: Any, *, idle_after: bool) -> str:
    """The trace line of one step, from vLLM's ``SchedulerOutput``."""
    return trace_line(
        wall_s,
        scheduler_output.num_scheduled_tokens,
        scheduler_output.total_num_scheduled_tokens,
        scheduler_output.scheduled_spec_decode_tokens,
        new_requests=len(scheduler_output.scheduled_new_reqs),
        finished_requests=len(scheduler_output.finished_req_ids),
        idle_after=idle_after,
        drafts_next=scheduler_output.num_spec_tokens_to_schedule,
    )


def step_trace_of(scheduler: Any) -> StepTrace | None:
    """The scheduler's step trace, opened on its first step when the environment asks for one
    (a trace that cannot be opened is logged and left off: it must not stop the engine)."""
    if TRACE_ATTR in scheduler.__dict__:
        found: StepTrace | None = scheduler.__dict__[TRACE_ATTR]
        return found
    try:
        found = open_trace_from_env()
    except (OSError, ValueError) as error:
        LOGGER.warning("tabletune: no step trace (%s)", error)
        found = None
    if found is not None:
        atexit.register(found.flush)
        LOGGER.info("tabletune: writing a step trace")
    setattr(scheduler, TRACE_ATTR, found)
    return found


def step_timer_of(scheduler: Any) -> StepTimer:
    """The scheduler's step timer, made on first use (its first step or first utility call)."""
    found: StepTimer | None = scheduler.__dict__.get(TIMER_ATTR)
    if found is None:
        found = StepTimer(started_at=time.time())
        setattr(scheduler, TIMER_ATTR, found)
    return found


def controller_of(core: Any) -> EngineTableController:
    """The engine core's controller, made on first use from its scheduler and config."""
    found: EngineTableController | None = core.__dict__.get(CONTROLLER_ATTR)
    if found is None:
        import vllm

        found = build_controller(core, engine_version=str(vllm.__version__))
        setattr(core, CONTROLLER_ATTR, found)
        LOGGER.info("tabletune: engine-side table admin ready (table %s)", found.state.ranges)
    return found


def build_controller(core: Any, *, engine_version: str) -> EngineTableController:
    """A controller over ``core.scheduler`` (vLLM's EngineCore, or anything shaped like it)."""
    scheduler = core.scheduler
    spec = core.vllm_config.speculative_config
    table = None if spec is None else spec.num_speculative_tokens_per_batch_size
    state = TableState.initial(
        None if table is None else [list(r) for r in table],
        num_speculative_tokens=int(scheduler.num_spec_tokens),
        max_num_seqs=int(scheduler.scheduler_config.max_num_seqs),
    )

    def install(lookup: Lookup) -> None:
        scheduler.dynamic_sd_lookup = lookup  # one assignment: the next step sees it whole

    timer = step_timer_of(scheduler)
    model_name = core.vllm_config.model_config.served_model_name
    # A profile holds for one parallel layout: the view reports it so the daemon can check.
    parallel = getattr(core.vllm_config, "parallel_config", None)
    tensor_parallel = getattr(parallel, "tensor_parallel_size", None)
    identity = EngineIdentity(
        engine_version,
        model_name=None if model_name is None else str(model_name),
        tensor_parallel_size=None if tensor_parallel is None else int(tensor_parallel),
    )
    return EngineTableController(
        state, install, identity=identity, timer=timer, read_cells=timer.read
    )
