"""vLLM general plugin ``tabletune_profiler``: lets the profiler switch the rejection sampler of a
running engine (every guess rejected for timing, the serving sampler or known synthetic rates
for acceptance), so one launch does both. Opt-in: name it in VLLM_PLUGINS; the profiler reaches
it through vLLM's /collective_rpc, which exists only with VLLM_SERVER_DEV_MODE=1.

Glue to vLLM 0.26 internals, version-gated: the V1 and V2 runners both keep the sampler's
per-position conditional rates in ``rejection_sampler.synthetic_conditional_rates`` (None =
standard) and read it on every step outside the CUDA graphs, so replacing it takes effect on the
next step. Imports vLLM and torch only inside functions (CI has neither).
"""

from __future__ import annotations

import importlib
import json
import logging
from typing import Any

from tabletune.profiler.hook_protocol import HOOK_METHOD, SamplerMode, conditional_rates

log = logging.getLogger("vllm.tabletune.profiler")
SUPPORTED_VLLM = ("0.26.",)


def _set_sampler(worker: Any, spec: str) -> dict[str, Any]:
    """The worker method: ``spec`` is SamplerMode JSON; returns what is now in force."""
    torch = importlib.import_module("torch")  # only inside vLLM's process
    mode = SamplerMode.from_json(json.loads(spec))
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "rejection_sampler", None)
    if sampler is None or not hasattr(sampler, "synthetic_conditional_rates"):
        raise RuntimeError("no rejection sampler with synthetic rates on this worker")
    if mode.kind == "standard":
        rates_tensor = None
    else:
        steps = int(getattr(sampler, "num_speculative_steps", len(mode.rates)))
        if len(mode.rates) != steps:
            raise ValueError(f"need {steps} rates, got {len(mode.rates)}")
        rates_tensor = torch.tensor(
            conditional_rates(mode.rates), dtype=torch.float32, device=worker.device
        )
    sampler.synthetic_conditional_rates = rates_tensor
    if hasattr(sampler, "synthetic_mode"):  # the V1 runner keeps a flag too
        sampler.synthetic_mode = rates_tensor is not None
    log.info("tabletune profiler: rejection sampler now %s", mode.to_json())
    return mode.to_json()


def register() -> None:
    """Entry point (``vllm.general_plugins``): add the method to vLLM's GPU worker class."""
    try:
        import vllm
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError:  # not inside vLLM: nothing to do
        return
    if not str(vllm.__version__).startswith(SUPPORTED_VLLM):
        log.warning(
            "tabletune profiler hook: vLLM %s not supported (%s); not installed",
            vllm.__version__,
            SUPPORTED_VLLM,
        )
        return
    setattr(Worker, HOOK_METHOD, _set_sampler)
