"""The eval_traffic driver and report (bench/gpu), loaded once for this folder's tests."""

from __future__ import annotations

from types import ModuleType

import pytest

from tests.support.gpu_jobs import eval_traffic_driver, eval_traffic_report


@pytest.fixture(scope="module")
def driver() -> ModuleType:
    return eval_traffic_driver()


@pytest.fixture(scope="module")
def report() -> ModuleType:
    return eval_traffic_report()
