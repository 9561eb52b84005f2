"""The Prometheus client: credentials from the settings, the URL or a file (re-read on every
query), TLS verified by default, and no secret in any error."""

from __future__ import annotations

import base64
import json
import ssl
from pathlib import Path

import httpx
import pytest

from tabletune.daemon.prometheus_http import PrometheusHttp, tls_verify
from tabletune.daemon.prometheus_source import PrometheusSource
from tabletune.daemon.settings import SourceSettings, load_settings
from tabletune.errors import InputError, TemporaryError


def source_settings(**env: str) -> SourceSettings:
    values = {"PROMETHEUS_URL": "https://prom:9090", **env}
    return load_settings({f"TABLETUNE_SOURCE__{k}": v for k, v in values.items()}).source


class Recorder:
    """A Prometheus answering every query with an empty vector, or ``status``."""

    def __init__(self, status: int = 200) -> None:
        self.requests: list[httpx.Request] = []
        self.status = status

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.status != 200:
            return httpx.Response(self.status, text="unauthorized")
        body = {"status": "success", "data": {"resultType": "vector", "result": []}}
        return httpx.Response(200, text=json.dumps(body))

    @property
    def authorization(self) -> str | None:
        return self.requests[-1].headers.get("Authorization")


def query(settings: SourceSettings, recorder: Recorder) -> None:
    PrometheusHttp(settings, transport=httpx.MockTransport(recorder)).custom_query("up")


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_no_credentials_no_header_and_the_query_is_posted() -> None:
    recorder = Recorder()
    query(source_settings(), recorder)
    request = recorder.requests[0]
    assert recorder.authorization is None
    assert request.method == "POST" and str(request.url) == "https://prom:9090/api/v1/query"
    assert b"query=up" in request.content


def test_basic_auth_from_the_settings_or_a_file(tmp_path: Path) -> None:
    recorder = Recorder()
    query(source_settings(PROMETHEUS_USERNAME="ops", PROMETHEUS_PASSWORD="s3cret"), recorder)
    assert recorder.authorization == basic("ops", "s3cret")
    secret = tmp_path / "password"
    secret.write_text("fr0m-file\n")
    query(
        source_settings(PROMETHEUS_USERNAME="ops", PROMETHEUS_PASSWORD_FILE=str(secret)), recorder
    )
    assert recorder.authorization == basic("ops", "fr0m-file")


def test_a_bearer_token_file_is_read_again_on_every_query(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first")
    recorder = Recorder()
    client = PrometheusHttp(
        source_settings(PROMETHEUS_BEARER_TOKEN_FILE=str(token)),
        transport=httpx.MockTransport(recorder),
    )
    client.custom_query("up")
    assert recorder.authorization == "Bearer first"
    token.write_text("rotated")
    client.custom_query("up")
    assert recorder.authorization == "Bearer rotated"


def test_an_unreadable_secret_file_stops_the_start_naming_its_variable(tmp_path: Path) -> None:
    settings = source_settings(PROMETHEUS_BEARER_TOKEN_FILE=str(tmp_path / "missing"))
    with pytest.raises(InputError, match="TABLETUNE_SOURCE__PROMETHEUS_BEARER_TOKEN_FILE"):
        PrometheusHttp(settings)


def test_url_credentials_become_basic_auth_and_never_show_in_errors() -> None:
    recorder = Recorder(status=401)
    settings = source_settings(PROMETHEUS_URL="https://ops:s3cret@prom:9090/")
    source = PrometheusSource(
        settings=settings, api=PrometheusHttp(settings, transport=httpx.MockTransport(recorder))
    )
    with pytest.raises(TemporaryError, match="HTTP 401") as raised:
        source.collect(1_000.0)
    assert "s3cret" not in str(raised.value)
    assert recorder.authorization == basic("ops", "s3cret")
    assert "s3cret" not in str(recorder.requests[0].url)


def test_connection_errors_are_temporary_and_masked() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    settings = source_settings(PROMETHEUS_URL="http://ops:s3cret@prom:9090")
    client = PrometheusHttp(settings, transport=httpx.MockTransport(refuse))
    with pytest.raises(TemporaryError, match="ConnectError") as raised:
        client.custom_query("up")
    assert "s3cret" not in str(raised.value)


def test_tls_is_verified_unless_turned_off(tmp_path: Path) -> None:
    assert tls_verify(source_settings()) is True
    assert tls_verify(source_settings(PROMETHEUS_TLS_VERIFY="false")) is False
    bad = tmp_path / "ca.pem"
    bad.write_text("not a certificate")
    with pytest.raises(InputError, match="TABLETUNE_SOURCE__PROMETHEUS_CA_FILE"):
        tls_verify(source_settings(PROMETHEUS_CA_FILE=str(bad)))
    system = ssl.get_default_verify_paths().cafile
    if system is not None and Path(system).exists():
        context = tls_verify(source_settings(PROMETHEUS_CA_FILE=system))
        assert isinstance(context, ssl.SSLContext)
        assert context.verify_mode == ssl.CERT_REQUIRED
