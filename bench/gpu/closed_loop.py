"""Closed-loop load on a vLLM server, measured by vLLM's own counters (bench/gpu/eval_h200.sh).

B clients each send one long request (``ignore_eos``) after another; after a warm-up, COUNT
windows of WINDOW seconds each print one JSON line: generation tokens per second from
``vllm:generation_tokens_total``, the effective batch (mean ``vllm:num_requests_running``), the k
that ran (draft tokens per draft) and the acceptance seen, plus the table in force at the end.
One client configuration for every arm (no connection limit), so arms differ only in the table.

With STAGGER=1 each client's first request carries a random-length prompt (32..OUTPUT_TOKENS random
token ids) and generates the rest up to OUTPUT_TOKENS + 32: contexts are spread over the whole
range from the start, so the load is steady (without it, all B requests start and end together,
and step time follows their common context length, which grows through each request).

    python3 closed_loop.py URL MODEL B WARMUP_S WINDOW_S COUNT OUTPUT_TOKENS LABEL_JSON
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

import aiohttp

PROMPT = list(range(1000, 1032))  # 32 token ids: dummy weights, so the content does not matter
COUNTERS = (
    "vllm:generation_tokens_total",
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:num_requests_running",
)


def scrape(text: str) -> dict[str, float]:
    """Sum of each wanted series over its labels (one engine here)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name in COUNTERS:
            values[name] = values.get(name, 0.0) + float(value)
    return values


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(f"{url}/metrics") as response:
        return scrape(await response.text())


def staggered_first(body: dict[str, object], output_tokens: int, seed: int) -> dict[str, object]:
    """The first request of one client: a random share of the context is already prompt."""
    rng = random.Random(seed)
    prompt_len = rng.randint(len(PROMPT), output_tokens)
    prompt = [rng.randrange(1000, 30000) for _ in range(prompt_len)]
    return {**body, "prompt": prompt, "max_tokens": output_tokens + len(PROMPT) - prompt_len + 1}


async def client(session: aiohttp.ClientSession, url: str, bodies: list[dict[str, object]]) -> None:
    """Send ``bodies[0]`` first, then ``bodies[-1]`` again and again."""
    index = 0
    while True:
        try:
            async with session.post(f"{url}/v1/completions", json=bodies[index]) as response:
                await response.read()
            index = len(bodies) - 1
        except aiohttp.ClientError:
            await asyncio.sleep(0.1)


async def one_window(
    session: aiohttp.ClientSession, url: str, window: float, started: float
) -> dict[str, object]:
    before = await metrics(session, url)
    t0 = time.monotonic()
    running = []
    while time.monotonic() - t0 < window:
        await asyncio.sleep(min(1.0, window))
        running.append((await metrics(session, url)).get("vllm:num_requests_running", 0.0))
    after = await metrics(session, url)
    elapsed = time.monotonic() - t0
    async with session.get(f"{url}/tabletune/v1/table") as response:
        table = (await response.json()).get("table")
    delta = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in COUNTERS}
    drafts = delta["vllm:spec_decode_num_drafts_total"]
    draft_tokens = delta["vllm:spec_decode_num_draft_tokens_total"]
    return {
        "window_s": elapsed,
        "window_end_s": time.monotonic() - started,
        "table": table,
        "tokens_per_s": delta["vllm:generation_tokens_total"] / elapsed,
        "mean_running": sum(running) / max(1, len(running)),
        "mean_k": draft_tokens / drafts if drafts else 0.0,
        "acceptance": (
            delta["vllm:spec_decode_num_accepted_tokens_total"] / draft_tokens
            if draft_tokens
            else None
        ),
        "drafts": drafts,
    }


async def run(
    url: str,
    model: str,
    batch: int,
    warmup: float,
    window: float,
    count: int,
    output_tokens: int,
    label: object,
) -> None:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": output_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
    }
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        stagger = os.environ.get("STAGGER") == "1"
        tasks = [
            asyncio.create_task(
                client(
                    session,
                    url,
                    [staggered_first(body, output_tokens, seed), body] if stagger else [body],
                )
            )
            for seed in range(batch)
        ]
        await asyncio.sleep(warmup)
        for _ in range(count):
            window_line = await one_window(session, url, window, started)
            print(json.dumps({"label": label, "batch": batch, **window_line}), flush=True)
        for task in tasks:
            task.cancel()  # closing the connections aborts the requests in vLLM
        await asyncio.gather(*tasks, return_exceptions=True)


def main(argv: list[str]) -> None:
    url, model, batch, warmup, window, count, output_tokens, label = argv
    asyncio.run(
        run(
            url,
            model,
            int(batch),
            float(warmup),
            float(window),
            int(count),
            int(output_tokens),
            json.loads(label),
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
