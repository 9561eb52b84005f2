"""Fuzzing the admin API as an attacker would: hypothesis draws whole HTTP requests (method,
path, raw header bytes, a body in chunks, the client's address) and sends them straight to the
ASGI app of the plugin or of the emulator (``tests.support.admin_apps``). Every answer must keep:

1. no 5xx (the engine is always attached here; its absence is the only deliberate 503);
2. a refused request changes nothing: the engine state before == after, and on the plugin the
   scheduler still runs the very same lookup object (no partial apply);
3. an accepted table is one vLLM takes (sorted inclusive ranges from 1, no overlap, 0 <= k <= K,
   k captured unless ``allow_uncaptured``) and is exactly the body's; accepted settings are the
   body's; a GET changes nothing; a conditional table PUT (``when_cell_steps``) is accepted
   exactly when the step cells its answer carries hold the steps asked, else a 412 with them;
4. an accepted write was allowed by the rules, judged here independently of the code under test
   (token, loopback opening, same-origin);
5. an error is a JSON object with a one-line ``detail``.

``run_fuzz`` is shared by the test suite (a few hundred requests) and ``bench/admin_fuzz.py``
(10,000, counted into bench/results/admin_fuzz.json).
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from tabletune.admin.auth import OPEN_ENV, TOKEN_ENV
from tabletune.admin.protocol import (
    API_PREFIX,
    MAX_BODY_BYTES,
    SETTINGS_PATH,
    TABLE_PATH,
    StepCellsRead,
)
from tabletune.admin.state import TableState
from tabletune.step_cells import CellTotals, cell_key
from tests.support.admin_apps import APPS, MAX_NUM_SEQS, TOKEN, AdminApp, K, RawAnswer, asgi_request

MODES: dict[str, dict[str, str]] = {
    "token": {TOKEN_ENV: TOKEN},
    "loopback": {OPEN_ENV: "loopback"},
    "none": {},
}
CURRENT = "<current version>"  # If-Match resolved to the state's version when sent

settings.register_profile(
    "admin-fuzz",
    max_examples=200,
    deadline=None,
    derandomize=True,  # no randomness between runs (the draws still follow the modules loaded)
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# 6 targets (plugin, emulator) x (token, loopback, none) x 1667 = 10,002 requests.
settings.register_profile("admin-fuzz-10k", settings.get_profile("admin-fuzz"), max_examples=1667)
settings.register_profile(
    "admin-fuzz-10k-random", settings.get_profile("admin-fuzz-10k"), derandomize=False
)


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    chunks: tuple[bytes, ...]
    client: tuple[str, int]
    if_match: str | None  # CURRENT, or the header value as sent


# --- strategies -----------------------------------------------------------------------------

INTS = st.one_of(
    st.integers(-3, 300),
    st.sampled_from([0, 1, K, K + 1, MAX_NUM_SEQS, 2**31 - 1, 2**31, 2**63, 2**64, -(2**64)]),
    st.integers(),
)
JSON_LEAVES = st.one_of(
    st.none(), st.booleans(), INTS, st.floats(allow_nan=False), st.text(max_size=8)
)
ANY_JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=12,
)


@st.composite
def valid_tables(draw: st.DrawFn) -> list[list[int]]:
    """Tables vLLM takes: consecutive ranges from 1 (the last may end past max_num_seqs)."""
    cuts = draw(st.lists(st.integers(2, MAX_NUM_SEQS), max_size=5, unique=True))
    starts = [1, *sorted(cuts)]
    ends = [s - 1 for s in starts[1:]] + [draw(st.sampled_from([MAX_NUM_SEQS, 512, 2**31 - 1]))]
    return [[s, e, draw(st.integers(0, K))] for s, e in zip(starts, ends, strict=True)]


def table_bodies() -> st.SearchStrategy[object]:
    near_valid = valid_tables().flatmap(
        lambda table: st.lists(st.lists(INTS, min_size=2, max_size=4), max_size=3).map(
            lambda noise: table + noise
        )
    )
    tables = st.one_of(
        valid_tables(),
        valid_tables(),
        near_valid,
        st.lists(st.lists(INTS, max_size=4), max_size=6),
        ANY_JSON,
    )
    return st.one_of(
        st.fixed_dictionaries({"table": tables}),
        st.fixed_dictionaries({"table": tables}),
        st.fixed_dictionaries(
            {"table": tables}, optional={"allow_uncaptured": ANY_JSON | st.booleans()}
        ),
        st.fixed_dictionaries({"table": valid_tables()}, optional={"extra": ANY_JSON}),
        st.fixed_dictionaries({"table": tables, "when_cell_steps": conditions()}),
        st.fixed_dictionaries({"table": valid_tables(), "when_cell_steps": conditions()}),
        ANY_JSON,
    )


def conditions() -> st.SearchStrategy[object]:
    """``when_cell_steps``: mostly well-formed (met at 0 steps, else a 412), or hostile."""
    count = st.one_of(st.integers(0, 2), INTS, ANY_JSON)
    return st.one_of(
        st.fixed_dictionaries(
            {"k": st.integers(0, K), "batch_size": st.integers(1, MAX_NUM_SEQS)},
            optional={"at_least": st.integers(0, 2)},
        ),
        st.fixed_dictionaries(
            {"k": count, "batch_size": count, "at_least": count}, optional={"x": ANY_JSON}
        ),
        ANY_JSON,
    )


def settings_bodies() -> st.SearchStrategy[object]:
    value = st.one_of(st.integers(0, 100), INTS, ANY_JSON)
    policy = st.one_of(st.sampled_from(["table", "nightjar", "Nightjar", None]), ANY_JSON)
    number = st.one_of(st.floats(-1, 150), st.integers(-1, 150), ANY_JSON)
    return st.one_of(
        st.fixed_dictionaries({}, optional={"exploration_interval": value, "hysteresis": value}),
        st.fixed_dictionaries(
            {}, optional={"exploration_interval": value, "hysteresis": value, "other": value}
        ),
        st.fixed_dictionaries(
            {},
            optional={
                "policy": policy,
                "nightjar_exploration": number,
                "step_timing": st.booleans() | ANY_JSON,
            },
        ),
        ANY_JSON,
    )


def raw_bodies() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=64),
        st.integers(900, 5000).map(lambda n: b'{"table": ' + b"[" * n + b"]" * n + b"}"),
        st.integers(1, 100_000).map(lambda n: b"[" * n),
        st.integers(4290, 6000).map(lambda n: b'{"table": [[1, 256, ' + b"9" * n + b"]]}"),
        st.integers(1, 3).map(lambda n: b'{"table": [' + b"[1,1,1]," * (MAX_BODY_BYTES // 8 * n)),
        st.just(b'{"\\ud800": 1}'),
        st.just(b"NaN"),
    )


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.sampled_from(["json"] * 4 + ["raw"]))
    if kind == "raw":
        return draw(raw_bodies())
    value = draw(table_bodies() if path == TABLE_PATH else settings_bodies())
    return json.dumps(value).encode()


def _chunks(body: bytes, cuts: list[int]) -> tuple[bytes, ...]:
    points = sorted({c % (len(body) + 1) for c in cuts} | {0, len(body)})
    return tuple(body[a:b] for a, b in itertools.pairwise(points)) or (b"",)


def mostly(sane: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``sane`` 4 times in 5: each hostile part must leave the rest of the request valid often
    enough for the request to get through and be accepted."""
    return st.integers(0, 4).flatmap(lambda roll: hostile if roll == 0 else sane)


AUTHORIZATION = mostly(
    st.sampled_from([f"Bearer {TOKEN}".encode(), f"bearer   {TOKEN}  ".encode()]),
    st.one_of(
        st.sampled_from([None, b"Bearer", b"Bearer ", f"Basic {TOKEN}".encode(), TOKEN.encode()]),
        st.binary(max_size=40).map(
            lambda b: b"Bearer " + b.replace(b"\r", b"").replace(b"\n", b"")
        ),
    ),
)
IF_MATCH = mostly(
    st.sampled_from([None, CURRENT]),
    st.one_of(
        st.sampled_from(["*", 'W/"0"', '"1"', "0", "99", "-1", "", '""', "1.0", "0x1"]),
        st.sampled_from(["\xb2", "\xb9\xb3", '"1\xb2"', "\xbd"]),  # isdigit, yet not int()
        st.text(alphabet="0123456789", min_size=17, max_size=6000),
        st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=12),
    ),
)
ORIGIN = mostly(
    st.sampled_from([None, None, "same"]),
    st.sampled_from(["http://evil.example", "null", "http://127.0.0.1:9", "x"]),
)
HOST = mostly(
    st.sampled_from([b"127.0.0.1:8000", b"localhost:8000", b"[::1]:8000"]),
    st.sampled_from([b"evil.example", b"10.1.2.3:8000", b""]),
)
CLIENT = mostly(
    st.sampled_from([("127.0.0.1", 50000), ("::1", 1)]),
    st.sampled_from([("10.1.2.3", 50000), ("::ffff:10.0.0.1", 2)]),
)
METHOD = mostly(st.just("PUT"), st.sampled_from(["GET", "OPTIONS", "POST", "DELETE", "PATCH"]))
PATH = mostly(st.sampled_from([TABLE_PATH, SETTINGS_PATH]), st.just(f"{API_PREFIX}/x"))
DECLARED = mostly(st.sampled_from(["exact", "none"]), st.sampled_from(["huge", "junk"]))


@st.composite
def requests(draw: st.DrawFn) -> FuzzRequest:
    method, path, host = draw(METHOD), draw(PATH), draw(HOST)
    headers: list[tuple[bytes, bytes]] = [(b"host", host)]
    authorization = draw(AUTHORIZATION)
    if authorization is not None:
        headers.append((b"authorization", authorization))
    origin = draw(ORIGIN)
    if origin is not None:
        headers.append((b"origin", b"http://" + host if origin == "same" else origin.encode()))
    if method == "OPTIONS":
        headers.append((b"access-control-request-method", b"PUT"))
    body = draw(bodies(path)) if method in ("PUT", "POST") else b""
    declared = draw(DECLARED)
    if declared == "exact":
        headers.append((b"content-length", str(len(body)).encode()))
    elif declared == "huge":
        headers.append((b"content-length", b"9" * 30))
    elif declared == "junk":
        headers.append((b"content-length", b"12abc"))
    else:
        headers.append((b"transfer-encoding", b"chunked"))
    headers.append((b"content-type", b"application/json"))
    cuts = draw(st.lists(st.integers(0, 2**20), max_size=4))
    return FuzzRequest(
        method, path, tuple(headers), _chunks(body, cuts), draw(CLIENT), draw(IF_MATCH)
    )


def attack(
    body: bytes,
    *,
    path: str = TABLE_PATH,
    method: str = "PUT",
    extra: tuple[tuple[bytes, bytes], ...] = (),
    if_match: str | None = None,
    chunk: int = 0,
) -> FuzzRequest:
    """A well-formed authorised request from this machine around one hostile part."""
    headers = ((b"host", b"127.0.0.1:8000"), (b"authorization", f"Bearer {TOKEN}".encode()))
    chunks = (
        (body,) if not chunk else tuple(body[i : i + chunk] for i in range(0, len(body), chunk))
    )
    return FuzzRequest(method, path, headers + extra, chunks, ("127.0.0.1", 50000), if_match)


GOOD = json.dumps({"table": [[1, 64, 3], [65, 256, 1]]}).encode()
WHEN_BEYOND_64_BITS = {"k": 1, "batch_size": 5, "at_least": 2**64}


def conditional(at_least: int) -> bytes:
    """GOOD on condition that the cell of k=3, B=64 holds ``at_least`` steps."""
    when = {"k": 3, "batch_size": 64, "at_least": at_least}
    return json.dumps({**json.loads(GOOD), "when_cell_steps": when}).encode()


# The attacks that once got a 5xx, a partial read or a browser through: every run starts with them.
ATTACKS = (
    attack(b'{"table": [' + b"[1,1,1]," * 20_000 + b"]}", chunk=4096),  # chunked, over 64 KiB
    attack(b'{"table": ' + b"[" * 5000 + b"]" * 5000 + b"}"),  # nested deeper than the stack
    attack(b'{"table": [[1, 256, ' + b"9" * 5000 + b"]]}"),  # more digits than int() takes
    attack(json.dumps({"table": [[1, 256, 2**64]]}).encode()),  # beyond msgpack
    attack(json.dumps({"table": [[-(2**64), 256, 1]]}).encode()),
    attack(json.dumps({"exploration_interval": 2**64}).encode(), path=SETTINGS_PATH),
    attack(GOOD, if_match="\xb2"),  # str.isdigit, not int()
    attack(GOOD, if_match="9" * 5000),
    attack(json.dumps({**json.loads(GOOD), "when_cell_steps": WHEN_BEYOND_64_BITS}).encode()),
    attack(b'{"\\ud800": 1}'),
    attack(b'{"table": [[1, 256, 1]], "forged\\nlog line": 1}'),  # a newline in the reason
    attack(GOOD, extra=((b"origin", b"http://evil.example"),)),
    attack(b"", method="OPTIONS", extra=((b"origin", b"http://evil.example"),)),
)
# One request per outcome, so every run judges accepted writes and each refusal whatever the
# random draws (hypothesis mines constants from the modules loaded, so its draws depend on what
# else a test session imported).
OUTCOMES = (
    attack(GOOD, if_match=CURRENT),  # accepted table
    attack(json.dumps({"exploration_interval": 5, "hysteresis": 1}).encode(), path=SETTINGS_PATH),
    attack(b'{"policy": "nightjar", "nightjar_exploration": 0.5}', path=SETTINGS_PATH),
    attack(GOOD, if_match='"999"'),  # 409
    attack(conditional(0), if_match=CURRENT),  # accepted: no engine here has stepped
    attack(conditional(1)),  # 412
    FuzzRequest("PUT", TABLE_PATH, ((b"host", b"127.0.0.1:8000"),), (GOOD,), ("10.1.2.3", 1), None),
)


# --- sending and judging --------------------------------------------------------------------


async def send(app: AdminApp, request: FuzzRequest, if_match: bytes | None) -> RawAnswer:
    """The request straight at the ASGI app (raw header bytes, the body in its chunks)."""
    headers = list(request.headers) + ([(b"if-match", if_match)] if if_match is not None else [])
    return await asgi_request(
        app.app,
        method=request.method,
        path=request.path,
        headers=headers,
        chunks=request.chunks,
        client=request.client,
    )


def _header(request: FuzzRequest, name: bytes) -> bytes | None:
    return next((value for key, value in request.headers if key == name), None)


def may_write(mode: str, request: FuzzRequest) -> bool:
    """The rules, restated: could this request change anything?"""
    origin, host = _header(request, b"origin"), _header(request, b"host")
    if origin is not None and not (host and origin in (b"http://" + host, b"https://" + host)):
        return False
    if mode == "token":
        scheme, _, given = (_header(request, b"authorization") or b"").partition(b" ")
        return scheme.lower() == b"bearer" and given.strip() == TOKEN.encode()
    if mode == "loopback":
        host = _header(request, b"host") or b""
        local_host = host.rsplit(b":", 1)[0] in (b"127.0.0.1", b"localhost", b"[::1]")
        return request.client[0] in ("127.0.0.1", "::1") and local_host
    return False


def invalid_table(ranges: tuple[tuple[int, int, int], ...]) -> str | None:
    """Why vLLM would refuse ``ranges`` (or K/capture would), restated from vLLM's rules."""
    previous_end = 0
    for start, end, k in ranges:
        if not 1 <= start <= end:
            return f"bad bounds {start}, {end}"
        if start <= previous_end:
            return f"overlap at {start}"
        if not 0 <= k <= K:
            return f"k={k} outside 0..{K}"
        previous_end = end
    if not ranges or ranges[0][0] != 1:
        return "does not start at 1"
    return None


@dataclass
class Tally:
    """What the fuzzer saw; ``violations`` must stay empty."""

    requests: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    accepted_tables: int = 0
    accepted_settings: int = 0
    violations: list[str] = field(default_factory=list)
    answers: list[tuple[int, bytes]] = field(default_factory=list)  # in order, for parity


def judge(
    mode: str,
    request: FuzzRequest,
    answer: RawAnswer,
    before: TableState,
    after: TableState,
    lookup_kept: bool,
) -> list[str]:
    """Every invariant the answer breaks (module docstring), as readable lines."""
    problems: list[str] = []
    status = answer.status
    if status >= 500:
        problems.append(f"HTTP {status}: {answer.body[:300]!r}")
    problems += _judge_condition(request, answer)
    if status != 200:
        if after != before or not lookup_kept:
            problems.append(f"refused ({status}) but the state changed: {before} -> {after}")
        if status >= 400:
            try:
                detail = json.loads(answer.body)["detail"]
                if not isinstance(detail, str) or "\n" in detail:
                    problems.append(f"detail not one line: {detail!r}")
            except (ValueError, KeyError, TypeError):
                problems.append(f"error body not JSON with detail: {answer.body[:200]!r}")
        return problems
    if request.method == "GET":
        if after != before:
            problems.append("a GET changed the state")
        return problems
    if not may_write(mode, request):
        problems.append(f"a write accepted against the rules ({mode}): {request.headers}")
    body = json.loads(b"".join(request.chunks))
    if after.version != before.version + 1:
        problems.append(f"accepted, version {before.version} -> {after.version}")
    if request.path == TABLE_PATH:
        assert after.ranges is not None
        why = invalid_table(after.ranges)
        if why is not None:
            problems.append(f"invalid table accepted ({why}): {after.ranges}")
        if sorted(tuple(r) for r in body["table"]) != list(after.ranges):
            problems.append(f"accepted table differs from the body: {after.ranges}")
        uncaptured = {k for _, _, k in after.ranges} - after.allowed_k
        if uncaptured and body.get("allow_uncaptured") is not True:
            problems.append(f"uncaptured k {uncaptured} accepted without allow_uncaptured")
    else:
        for name in ("exploration_interval", "hysteresis", "policy", "nightjar_exploration"):
            given = body.get(name)  # omitted or null: stays as it was
            expected = getattr(before, name) if given is None else given
            if getattr(after, name) != expected:
                problems.append(f"{name}: {getattr(after, name)} accepted, body {expected}")
        if after.policy == "nightjar" and not (after.step_timing and after.dynamic):
            problems.append("the bandit accepted without step timing or a table")
        if after.ranges != before.ranges:
            problems.append("a settings change changed the table")
    return problems


def _judge_condition(request: FuzzRequest, answer: RawAnswer) -> list[str]:
    """A conditional table PUT accepted or refused on its condition (412) carries the step
    cells it was decided on, and they say what the answer says; no other answer has them."""
    reading = None
    if answer.status in (200, 412) and request.method == "PUT" and request.path == TABLE_PATH:
        reading = json.loads(answer.body).get("step_cells")
    if reading is None:
        return ["a 412 without the step cells"] if answer.status == 412 else []
    when = json.loads(b"".join(request.chunks)).get("when_cell_steps")
    if not isinstance(when, dict):
        return [f"step cells in the answer to an unconditional PUT: {answer.body[:200]!r}"]
    cells = StepCellsRead.from_wire(reading).cells
    held = cells.get(cell_key(when["k"], when["batch_size"]), CellTotals()).steps
    if (held >= when["at_least"]) != (answer.status == 200):
        return [f"HTTP {answer.status} with {held} steps in the cell, asked {when}"]
    return []


def resolve_if_match(request: FuzzRequest, state: TableState) -> bytes | None:
    if request.if_match is None:
        return None
    if request.if_match == CURRENT:
        return f'"{state.version}"'.encode()
    return request.if_match.encode("latin-1")


def run_fuzz(
    target: str,
    mode: str,
    *,
    profile: str,
    tally: Tally,
    strict: bool = True,
    random_seed: int | None = None,
) -> None:
    """Fuzz one target (``plugin``/``sim``) under one access mode; ``strict`` raises on the
    first broken invariant (hypothesis then shrinks it), else it is only counted. A profile
    that is not derandomized draws from ``random_seed``."""
    app = APPS[target](MODES[mode])
    loop = asyncio.new_event_loop()

    def one(request: FuzzRequest) -> None:
        before, lookup = app.state(), app.installed()
        answer = loop.run_until_complete(send(app, request, resolve_if_match(request, before)))
        after = app.state()
        problems = judge(mode, request, answer, before, after, app.installed() is lookup)
        tally.requests += 1
        tally.statuses[answer.status] += 1
        tally.answers.append((answer.status, answer.body))
        if answer.status == 200 and request.method == "PUT":
            if request.path == TABLE_PATH:
                tally.accepted_tables += 1
            else:
                tally.accepted_settings += 1
        tally.violations.extend(f"{target}/{mode}: {p}" for p in problems)
        if strict:
            assert not problems, problems

    fuzzed = given(request=requests())(one)
    for request in ATTACKS + OUTCOMES:
        fuzzed = example(request=request)(fuzzed)
    if random_seed is not None:
        fuzzed = seed(random_seed)(fuzzed)
    try:
        settings(settings.get_profile(profile))(fuzzed)()
    finally:
        loop.close()


def all_targets() -> Iterator[tuple[str, str]]:
    for target in sorted(APPS):
        for mode in MODES:
            yield target, mode
