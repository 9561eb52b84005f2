"""The admin API as an attacker tries it, on the plugin (in vLLM's app, CORS as vLLM adds it)
and on the emulator, which must answer the same: tokens required for writes, the explicit
loopback opening, vLLM's --api-key, browsers refused, placeholders refused (fail closed), bodies
bounded while streaming, and no request that used to give a 5xx."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from argparse import Namespace
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.testclient import TestClient

from tabletune.admin.auth import (
    OPEN_ENV,
    TOKEN_ENV,
    TOKEN_FILE_ENV,
    VLLM_API_KEY_ENV,
    AdminAuth,
    Caller,
    auth_from_env,
    authorize,
    build_auth,
    cross_origin_problem,
    is_loopback_host,
    own_token,
    token_problem,
)
from tabletune.admin.protocol import (
    MAX_BODY_BYTES,
    MAX_WIRE_INT,
    SETTINGS_PATH,
    STEP_CELLS_PATH,
    TABLE_PATH,
)
from tabletune.admin.router import one_line
from tabletune.admin.state import AdminError, parse_if_match
from tabletune.errors import InputError
from tabletune.plugin import wire
from tests.support.admin_apps import (
    APPS,
    LOCAL,
    LOOPBACK_CLIENT,
    REMOTE_CLIENT,
    START,
    TOKEN,
    WALL,
    AdminApp,
    RawAnswer,
    asgi_request,
    plugin_app,
)

AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOOD_PUT = {"table": [[1, 64, 3], [65, 256, 1]]}
App = Callable[[Mapping[str, str]], AdminApp]


@pytest.fixture(params=sorted(APPS))
def make(request: pytest.FixtureRequest) -> App:
    """Each test runs on the plugin and on the emulator."""
    return APPS[request.param]


def unchanged(app: AdminApp) -> bool:
    state = app.state()
    return state.version == 0 and [list(r) for r in state.ranges or ()] == START


# --- the rules, pure ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token", "words"),
    [
        ("", "empty"),
        ("short-token", "shorter than 16"),
        ("change-me", "placeholder"),
        ("CHANGE-ME-to-something-long", "placeholder"),
        ("REPLACE-ME-with-the-output-of-openssl-rand-hex-32", "placeholder"),
        ("a token with spaces in it", "printable ASCII"),
        ("jeton-très-long-et-secret", "printable ASCII"),
    ],
)
def test_weak_tokens_are_refused(token: str, words: str) -> None:
    problem = token_problem(token)
    assert problem is not None and words in problem


def test_a_random_token_is_fine() -> None:
    assert token_problem("3f9c2a7d41e0b6c85d2f1a9e7b3c4d60") is None
    assert token_problem(TOKEN) is None


def test_token_file_is_read_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    assert own_token(None, path) == TOKEN
    path.write_text("change-me\n")
    with pytest.raises(InputError, match=f"{TOKEN_FILE_ENV}=.*placeholder"):
        own_token(None, path)
    with pytest.raises(InputError, match="cannot read"):
        own_token(None, tmp_path / "missing")
    with pytest.raises(InputError, match="not both"):
        own_token(TOKEN, path)
    assert own_token(None, None) is None


@pytest.mark.parametrize(
    ("env", "closed_because"),
    [
        ({TOKEN_ENV: "change-me"}, "placeholder"),
        ({TOKEN_ENV: "tiny"}, "shorter"),
        ({TOKEN_FILE_ENV: "/nonexistent/admin-token"}, "cannot read"),
        ({TOKEN_ENV: TOKEN, TOKEN_FILE_ENV: "/x"}, "not both"),
        ({OPEN_ENV: "1"}, "only value"),
    ],
)
def test_an_unusable_configuration_closes_everything(
    make: App, env: dict[str, str], closed_because: str
) -> None:
    app = make(env)
    client = app.client(client=LOOPBACK_CLIENT)
    for response in (
        client.get(TABLE_PATH, headers=AUTH),
        client.put(TABLE_PATH, json=GOOD_PUT, headers=AUTH),
        client.put(SETTINGS_PATH, json={"hysteresis": 1}, headers=AUTH),
    ):
        assert response.status_code == 403, response.text
        assert "admin API closed" in response.json()["detail"]
        assert closed_because in response.json()["detail"]
    assert unchanged(app)


# --- tokens -----------------------------------------------------------------------------------


def test_without_a_token_reads_are_open_and_writes_refused(make: App) -> None:
    app = make({})
    client = app.client(client=LOOPBACK_CLIENT)  # even from this machine
    assert client.get(TABLE_PATH).status_code == 200
    assert client.get(STEP_CELLS_PATH).status_code == 200
    for path, body in ((TABLE_PATH, GOOD_PUT), (SETTINGS_PATH, {"hysteresis": 1})):
        refused = client.put(path, json=body)
        assert refused.status_code == 403
        assert TOKEN_ENV in refused.json()["detail"]
    assert unchanged(app)


def test_with_a_token_every_route_needs_it(make: App) -> None:
    app = make({TOKEN_ENV: TOKEN})
    client = app.client()
    assert client.get(TABLE_PATH).status_code == 401
    assert client.get(STEP_CELLS_PATH).status_code == 401
    assert client.get(STEP_CELLS_PATH, headers=AUTH).status_code == 200
    for header in ("Bearer wrong-0123456789abcdef", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"):
        refused = client.put(TABLE_PATH, json=GOOD_PUT, headers={"Authorization": header})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert unchanged(app)
    assert client.put(TABLE_PATH, json=GOOD_PUT, headers=AUTH).status_code == 200
    assert app.state().version == 1


def test_the_token_file_works_like_the_variable(make: App, tmp_path: Path) -> None:
    path = tmp_path / "admin-token"
    path.write_text(TOKEN + "\n")
    client = make({TOKEN_FILE_ENV: str(path)}).client()
    assert client.put(TABLE_PATH, json=GOOD_PUT).status_code == 401
    assert client.put(TABLE_PATH, json=GOOD_PUT, headers=AUTH).status_code == 200


# --- the explicit loopback opening ----------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "base_url", "status"),
    [
        (LOOPBACK_CLIENT, LOCAL, 200),
        (LOOPBACK_CLIENT, "http://localhost:8000", 200),
        (("::1", 50000), "http://[::1]:8000", 200),
        (("::ffff:127.0.0.1", 50000), LOCAL, 200),
        (REMOTE_CLIENT, LOCAL, 403),  # another machine
        (("testclient", 50000), LOCAL, 403),  # not an address
        (LOOPBACK_CLIENT, "http://tabletune.example:8000", 403),  # DNS rebinding to 127.0.0.1
        (LOOPBACK_CLIENT, "http://10.1.2.3:8000", 403),  # the server's public address
    ],
)
def test_open_to_loopback_means_this_machine_only(
    make: App, client: tuple[str, int], base_url: str, status: int
) -> None:
    app = make({OPEN_ENV: "loopback"})
    http = app.client(client=client, base_url=base_url)
    assert http.get(TABLE_PATH).status_code == 200  # reads are open anyway
    response = http.put(TABLE_PATH, json=GOOD_PUT)
    assert response.status_code == status, response.text
    assert unchanged(app) == (status != 200)


def test_a_token_wins_over_the_opening(make: App) -> None:
    client = make({OPEN_ENV: "loopback", TOKEN_ENV: TOKEN}).client(client=LOOPBACK_CLIENT)
    assert client.put(TABLE_PATH, json=GOOD_PUT).status_code == 401


def test_loopback_host_names() -> None:
    for host in ("localhost", "localhost:8000", "127.0.0.1:1", "127.8.9.10", "[::1]:8000"):
        assert is_loopback_host(host), host
    for host in (None, "", "evil.example", "10.0.0.1:8000", "evil@127.0.0.1", "[::1"):
        assert not is_loopback_host(host), host


# --- vLLM's --api-key ---------------------------------------------------------------------


def test_vllms_api_key_is_an_admin_token() -> None:
    key = "vllm-key-0123456789abcdef"
    client = plugin_app({}, args=Namespace(api_key=[key])).client()
    assert client.put(TABLE_PATH, json=GOOD_PUT).status_code == 401
    ok = client.put(TABLE_PATH, json=GOOD_PUT, headers={"Authorization": f"Bearer {key}"})
    assert ok.status_code == 200


def test_vllm_api_key_env_counts_unless_the_flag_is_given() -> None:
    env_key, flag_key = "env-key-0123456789abcdef", "flag-key-0123456789abcdef"
    from_env = plugin_app({VLLM_API_KEY_ENV: env_key}).client()
    assert from_env.get(TABLE_PATH, headers={"Authorization": f"Bearer {env_key}"}).is_success
    both = plugin_app({VLLM_API_KEY_ENV: env_key}, args=Namespace(api_key=[flag_key])).client()
    assert both.get(TABLE_PATH, headers={"Authorization": f"Bearer {env_key}"}).status_code == 401
    assert both.get(TABLE_PATH, headers={"Authorization": f"Bearer {flag_key}"}).is_success


def test_both_the_api_key_and_the_admin_token_are_accepted() -> None:
    key = "vllm-key-0123456789abcdef"
    client = plugin_app({TOKEN_ENV: TOKEN}, args=Namespace(api_key=[key])).client()
    assert client.get(TABLE_PATH, headers=AUTH).is_success
    assert client.get(TABLE_PATH, headers={"Authorization": f"Bearer {key}"}).is_success


def test_a_weak_api_key_is_not_an_admin_token() -> None:
    weak = plugin_app({}, args=Namespace(api_key=["token-abc123"])).client()
    closed = weak.get(TABLE_PATH, headers={"Authorization": "Bearer token-abc123"})
    assert closed.status_code == 403 and "--api-key" in closed.json()["detail"]
    with_token = plugin_app({TOKEN_ENV: TOKEN}, args=Namespace(api_key=["token-abc123"]))
    client = with_token.client()
    weak_key = {"Authorization": "Bearer token-abc123"}
    assert client.get(TABLE_PATH, headers=weak_key).status_code == 401
    assert client.get(TABLE_PATH, headers=AUTH).is_success


def test_the_plugin_logs_its_rules_and_a_closed_api_as_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="vllm.tabletune.http"):
        plugin_app({TOKEN_ENV: "change-me"})
        plugin_app({TOKEN_ENV: TOKEN})
    closed, ok = caplog.records[-2:]
    assert closed.levelno == logging.ERROR and "CLOSED" in closed.getMessage()
    assert "placeholder" in closed.getMessage() and "change-me" not in closed.getMessage()
    assert ok.levelno == logging.INFO and "bearer token required" in ok.getMessage()


def test_before_init_state_everything_is_refused() -> None:
    from tabletune.plugin.http import TableTuneEndpoint

    app = FastAPI()
    TableTuneEndpoint().attach_router(app)
    response = TestClient(app).get(TABLE_PATH)
    assert response.status_code == 403 and "init_state" in response.json()["detail"]


def test_rules_in_one_place() -> None:
    open_rules = build_auth(token=None, open_value="loopback")
    remote_write = Caller(write=True, client_host="10.0.0.1", host="127.0.0.1")
    with pytest.raises(AdminError) as caught:
        authorize(open_rules, remote_write)
    assert caught.value.status == 403
    authorize(open_rules, Caller(write=False, client_host="10.0.0.1"))  # reads are open
    assert auth_from_env({TOKEN_ENV: TOKEN}) == AdminAuth(tokens=(TOKEN,))
    assert TOKEN not in repr(auth_from_env({TOKEN_ENV: TOKEN}))
    assert "CLOSED" in auth_from_env({TOKEN_ENV: "change-me"}).describe()


# --- browsers -----------------------------------------------------------------------------


def test_vllms_cors_alone_would_let_a_web_page_preflight_a_put() -> None:
    # What the guard is for: vLLM's CORSMiddleware answers any origin's preflight.
    app = FastAPI()

    @app.put(TABLE_PATH)
    async def put() -> dict[str, str]:
        return {}

    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"])
    preflight = TestClient(app).options(
        TABLE_PATH,
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "PUT"},
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("path", [TABLE_PATH, SETTINGS_PATH])
def test_preflight_is_refused_without_cors_headers(make: App, path: str) -> None:
    client = make({OPEN_ENV: "loopback"}).client(client=LOOPBACK_CLIENT)
    response = client.options(
        path,
        headers={
            "Origin": "http://evil.example",
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "content-type,authorization",
        },
    )
    assert response.status_code == 403 and "preflight" in response.json()["detail"]
    assert not [h for h in response.headers if h.startswith("access-control-")]


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:9999", "x"])
def test_cross_origin_requests_are_refused_even_with_the_token(make: App, origin: str) -> None:
    app = make({TOKEN_ENV: TOKEN})
    client = app.client(client=LOOPBACK_CLIENT)
    for response in (
        client.put(TABLE_PATH, json=GOOD_PUT, headers={**AUTH, "Origin": origin}),
        client.get(TABLE_PATH, headers={**AUTH, "Origin": origin}),
    ):
        assert response.status_code == 403 and "cross-origin" in response.json()["detail"]
        assert "access-control-allow-origin" not in response.headers
    assert unchanged(app)


def test_a_same_origin_request_passes(make: App) -> None:
    client = make({TOKEN_ENV: TOKEN}).client()
    response = client.put(TABLE_PATH, json=GOOD_PUT, headers={**AUTH, "Origin": LOCAL})
    assert response.status_code == 200


def test_other_routes_keep_vllms_cors() -> None:
    app = plugin_app({}).app

    @app.get("/v1/models")
    async def models() -> dict[str, str]:
        return {}

    response = TestClient(app).get("/v1/models", headers={"Origin": "http://evil.example"})
    assert response.headers["access-control-allow-origin"] == "*"


# --- bodies ---------------------------------------------------------------------------------


def test_a_chunked_body_over_the_limit_is_refused(make: App) -> None:
    # No Content-Length (Transfer-Encoding: chunked): the length is only known while reading.
    app = make({TOKEN_ENV: TOKEN})
    chunks = [b'{"table": [' + b"[1, 256, 1], " * 700] * 10

    def body() -> Any:
        yield from chunks

    response = app.client().put(TABLE_PATH, content=body(), headers=AUTH)
    assert response.status_code == 413
    assert unchanged(app)


def raw_put(
    app: AdminApp, headers: list[tuple[bytes, bytes]], chunks: Iterator[bytes]
) -> RawAnswer:
    host = (b"host", b"127.0.0.1:8000")
    request = asgi_request(
        app.app, method="PUT", path=TABLE_PATH, headers=[host, *headers], chunks=chunks
    )
    return asyncio.run(request)


def test_the_body_stream_is_abandoned_at_the_limit(make: App) -> None:
    app = make({TOKEN_ENV: TOKEN})
    endless = itertools.repeat(b"x" * 4096)
    chunked = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"transfer-encoding", b"chunked")]
    answer = raw_put(app, chunked, endless)
    assert answer.status == 413 and answer.pulled == MAX_BODY_BYTES // 4096 + 1
    assert unchanged(app)


@pytest.mark.parametrize("value", [b"\xb2", b'"1\xb3"', b"\xb9"])
def test_if_match_with_a_latin1_digit_is_a_400(make: App, value: bytes) -> None:
    # '²' as clients send it: one byte, read as Latin-1; str.isdigit takes it, int() does not.
    app = make({TOKEN_ENV: TOKEN})
    headers = [(b"authorization", f"Bearer {TOKEN}".encode()), (b"if-match", value)]
    answer = raw_put(app, headers, iter([json.dumps(GOOD_PUT).encode()]))
    assert answer.status == 400 and "If-Match" in json.loads(answer.body)["detail"]
    assert unchanged(app)


def test_a_declared_length_over_the_limit_is_refused_before_reading(make: App) -> None:
    app = make({TOKEN_ENV: TOKEN})
    headers = {**AUTH, "Content-Length": str(10**30)}
    assert app.client().put(TABLE_PATH, content=b"{}", headers=headers).status_code in (400, 413)


# --- former 5xx: each a 4xx with a reason, nothing changed ---------------------------------


def _deep(levels: int) -> bytes:
    return b'{"table": ' + b"[" * levels + b"]" * levels + b"}"


@pytest.mark.parametrize(
    ("path", "content", "headers", "status", "words"),
    [
        (TABLE_PATH, json.dumps(GOOD_PUT), {"If-Match": "9" * 5000}, 400, "digits"),
        (TABLE_PATH, json.dumps(GOOD_PUT), {"If-Match": str(2**64)}, 400, "digits"),
        (TABLE_PATH, _deep(5000), {}, 400, "nested too deeply"),
        (TABLE_PATH, _deep(950), {}, None, ""),
        (TABLE_PATH, b'{"table": [[1, 256, ' + b"7" * 5000 + b"]]}", {}, 400, "digits"),
        (TABLE_PATH, json.dumps({"table": [[1, 256, 2**64]]}), {}, 422, "less than"),
        (TABLE_PATH, json.dumps({"table": [[1, 2**64, 1]]}), {}, 422, "less than"),
        (TABLE_PATH, json.dumps({"table": [[-(2**64), 256, 1]]}), {}, 422, "greater than"),
        (TABLE_PATH, json.dumps({"table": [[1, MAX_WIRE_INT + 1, 1]]}), {}, 422, "less than"),
        (SETTINGS_PATH, json.dumps({"exploration_interval": 2**64}), {}, 422, "less than"),
        (SETTINGS_PATH, json.dumps({"hysteresis": -(2**70)}), {}, 422, "greater than"),
        (TABLE_PATH, b'{"\\ud800": 1, "table": [[1, 256, 1]]}', {}, 422, "body"),
        (TABLE_PATH, b"\xff\xfe{", {}, 400, "JSON"),
        (TABLE_PATH, b"NaN", {}, 422, "object"),
    ],
)
def test_former_server_errors_are_client_errors(
    make: App,
    path: str,
    content: str | bytes,
    headers: dict[str, str],
    status: int | None,
    words: str,
) -> None:
    app = make({TOKEN_ENV: TOKEN})
    response = app.client().put(path, content=content, headers={**AUTH, **headers})
    assert 400 <= response.status_code < 500, response.text
    if status is not None:
        assert response.status_code == status, response.text
        assert words in response.json()["detail"]
    assert unchanged(app) and app.state().hysteresis == 0
    if app.name == "plugin":
        assert wire.PUT_TABLE not in app.engine_calls  # refused before the engine process


def test_if_match_takes_ascii_digits_only() -> None:
    assert parse_if_match('"123"') == 123
    for value in ("²", "١٢", "1²", "+1", "-1", " ", '""', "1" * 19):
        with pytest.raises(AdminError) as caught:
            parse_if_match(value)
        assert caught.value.status == 400


def test_the_largest_wire_integer_reaches_the_engine() -> None:
    # MAX_WIRE_INT passes the HTTP side and is refused by the engine's table rules, not by a
    # failed utility call: the engine's 422, not a 503.
    app = plugin_app({TOKEN_ENV: TOKEN})
    body = {"table": [[1, 256, MAX_WIRE_INT]]}
    response = app.client().put(TABLE_PATH, json=body, headers=AUTH)
    assert response.status_code == 422 and "exceeds" in response.json()["detail"]
    assert wire.PUT_TABLE in app.engine_calls


def test_plugin_and_emulator_answer_alike() -> None:
    env = {TOKEN_ENV: TOKEN}
    plugin, sim = plugin_app(env).client(), APPS["sim"](env).client()
    requests: list[tuple[str, str, dict[str, Any]]] = [
        ("GET", TABLE_PATH, {}),
        ("GET", SETTINGS_PATH, {"headers": AUTH}),
        ("PUT", TABLE_PATH, {"json": GOOD_PUT}),
        ("PUT", TABLE_PATH, {"json": {"table": [[1, 8, 3], [8, 256, 1]]}, "headers": AUTH}),
        ("PUT", TABLE_PATH, {"json": GOOD_PUT, "headers": {**AUTH, "If-Match": '"3"'}}),
        ("PUT", TABLE_PATH, {"json": GOOD_PUT, "headers": AUTH}),
        ("PUT", SETTINGS_PATH, {"json": {"hysteresis": 2}, "headers": AUTH}),
        ("PUT", SETTINGS_PATH, {"json": {"hysteresis": "2"}, "headers": AUTH}),
        ("OPTIONS", TABLE_PATH, {"headers": {"Origin": "http://e", "Origin-X": "1"}}),
        ("GET", STEP_CELLS_PATH, {}),
        ("GET", STEP_CELLS_PATH, {"headers": {**AUTH, "Origin": "http://e"}}),
        ("PUT", STEP_CELLS_PATH, {"json": {}, "headers": AUTH}),
        ("GET", STEP_CELLS_PATH, {"headers": AUTH}),
    ]
    for method, path, kwargs in requests:
        ours, theirs = plugin.request(method, path, **kwargs), sim.request(method, path, **kwargs)
        assert ours.status_code == theirs.status_code, (method, path, kwargs)
        assert ours.json() == theirs.json() or ours.status_code == 200
    # both engines started at the same wall time and have not stepped: the same cells
    cells = plugin.get(STEP_CELLS_PATH, headers=AUTH), sim.get(STEP_CELLS_PATH, headers=AUTH)
    assert cells[0].json() == cells[1].json() and cells[0].json()["started_at"] == WALL


def test_an_origin_is_same_only_as_an_http_url_of_a_host_that_was_sent() -> None:
    # Found by the fuzzer: Origin "x" (no host in it) matched an empty Host header.
    assert cross_origin_problem("PUT", "x", "") is not None
    assert cross_origin_problem("PUT", "x", None) is not None
    assert cross_origin_problem("PUT", "ftp://127.0.0.1:8000", "127.0.0.1:8000") is not None
    assert cross_origin_problem("PUT", "http://[::1", "[::1") is not None
    assert cross_origin_problem("PUT", "https://127.0.0.1:8000", "127.0.0.1:8000") is None
    assert cross_origin_problem("PUT", None, None) is None


def test_a_refusal_is_one_printable_line_whatever_was_sent() -> None:
    # Found by the fuzzer: field names with newlines came back in the 422's detail.
    assert one_line("a\nb\x82\ud800c") == "a\\nb\\x82\\ud800c"
    assert len(one_line("x" * 10_000)) == 2003
    app = plugin_app({TOKEN_ENV: TOKEN})
    body = b'{"table": [[1, 256, 1]], "a\\nforged log line": 1}'
    response = app.client().put(TABLE_PATH, content=body, headers=AUTH)
    assert response.status_code == 422
    assert "\n" not in response.json()["detail"] and "a\\nforged" in response.json()["detail"]
