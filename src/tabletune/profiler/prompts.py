"""Prompts: fresh synthetic token ids for timing (no prefix-cache hits between requests), and
the acceptance prompt set (JSONL text or token ids, or synthetic ids for tokenizer-less models).
"""

from __future__ import annotations

import json
import random
from importlib import resources
from pathlib import Path

from tabletune.errors import InputError
from tabletune.profiler.settings import TimingSettings

Prompt = str | list[int]

BUNDLED_PROMPTS = "chat_prompts.jsonl"
"""325 chat-like user requests written for TableTune (profiler/data/README.md)"""


class TokenPrompts:
    """Endless fresh prompts of token ids from one seeded generator."""

    def __init__(self, *, length: int, low: int, high: int, seed: int) -> None:
        if length < 1 or not 0 <= low < high:
            raise InputError("prompts: need length >= 1 and 0 <= low < high")
        self._length = length
        self._low = low
        self._high = high
        self._random = random.Random(seed)

    @classmethod
    def for_timing(cls, timing: TimingSettings, *, seed_offset: int = 0) -> TokenPrompts:
        """Prompts as the timing settings say (length, id range, seed + ``seed_offset``)."""
        return cls(
            length=timing.prompt_tokens,
            low=timing.token_id_low,
            high=timing.token_id_high,
            seed=timing.seed + seed_offset,
        )

    def take(self, count: int) -> list[list[int]]:
        return [
            [self._random.randrange(self._low, self._high) for _ in range(self._length)]
            for _ in range(count)
        ]


def load_prompt_set(path: str | Path, *, limit: int) -> list[Prompt]:
    """Up to ``limit`` prompts from JSONL: ``{"prompt": "..."}`` or ``{"prompt_token_ids": [...]}``
    per line (a bare JSON string or list of ints is accepted too)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read prompts: {error}") from None
    return parse_prompt_set(text, limit=limit, where=str(path))


def bundled_prompts(*, limit: int) -> list[Prompt]:
    """The bundled chat-like prompt set (text; needs a server with a tokenizer)."""
    text = (
        resources.files("tabletune.profiler")
        .joinpath("data", BUNDLED_PROMPTS)
        .read_text(encoding="utf-8")
    )
    return parse_prompt_set(text, limit=limit, where=BUNDLED_PROMPTS)


def parse_prompt_set(text: str, *, limit: int, where: str) -> list[Prompt]:
    """``load_prompt_set`` on text already read (``where`` names it in errors)."""
    prompts: list[Prompt] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise InputError(f"{where}:{number}: not JSON: {error.msg}") from None
        if isinstance(item, dict):
            item = item.get("prompt_token_ids", item.get("prompt"))
        if isinstance(item, str) and item:
            prompts.append(item)
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in item)
        ):
            prompts.append(list(item))
        else:
            raise InputError(
                f"{where}:{number}: expected a non-empty 'prompt' string or 'prompt_token_ids' "
                "list of non-negative ints"
            )
        if len(prompts) >= limit:
            break
    if not prompts:
        raise InputError(f"{where}: no prompts")
    return prompts
