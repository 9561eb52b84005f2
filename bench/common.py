"""What every benchmark result records: where, on what, when."""

from __future__ import annotations

import json
import platform
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tabletune import __version__

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment(device: str | None = None, engine_version: str | None = None) -> dict[str, Any]:
    return {
        "device": device or f"CPU: {cpu_name()}",
        "engine_version": engine_version,
        "python": platform.python_version(),
        "tabletune_version": __version__,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_result(name: str, payload: dict[str, Any], *, smoke: bool = False) -> Path:
    """bench/results/NAME.json; a smoke run (--quick) goes to the ignored raw/ folder instead,
    never over the committed result."""
    folder = RESULTS / "raw" if smoke else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / (f"{name}_quick.json" if smoke else f"{name}.json")
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return path


def goal(measured: Any, target: str, ok: bool) -> dict[str, Any]:
    """One entry of a result's ``goals`` object."""
    return {"measured": measured, "goal": target, "pass": bool(ok)}
