"""Prometheus's query API for the daemon: httpx, POST queries, credentials from the settings,
a file (re-read on every query) or the URL, TLS verified by default; no secret in any error.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import Generator
from pathlib import Path
from typing import Any, Protocol

import httpx

from tabletune.daemon.settings import SourceSettings
from tabletune.errors import InputError, TemporaryError


class QueryApi(Protocol):
    """An instant query: the ``result`` list of Prometheus's answer (vector or matrix)."""

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any: ...


def _secret_file(path: Path, variable: str) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise InputError(f"{variable}: cannot read {path}: {error.strerror}") from None


class PrometheusAuth(httpx.Auth):
    """Basic or bearer credentials from the settings; secret files are read on each request,
    so a rotated token (a Kubernetes service-account token) is picked up without a restart."""

    def __init__(self, settings: SourceSettings) -> None:
        self._settings = settings
        self.header()  # an unreadable file stops the daemon at start, naming its variable

    def header(self) -> str | None:
        s = self._settings
        if s.prometheus_bearer_token is not None:
            return f"Bearer {s.prometheus_bearer_token.get_secret_value()}"
        if s.prometheus_bearer_token_file is not None:
            token = _secret_file(
                s.prometheus_bearer_token_file, "TABLETUNE_SOURCE__PROMETHEUS_BEARER_TOKEN_FILE"
            )
            return f"Bearer {token}"
        if s.prometheus_username is None:
            return None
        if s.prometheus_password_file is not None:
            password = _secret_file(
                s.prometheus_password_file, "TABLETUNE_SOURCE__PROMETHEUS_PASSWORD_FILE"
            )
        elif s.prometheus_password is not None:
            password = s.prometheus_password.get_secret_value()
        else:
            password = ""
        pair = f"{s.prometheus_username}:{password}".encode()
        return f"Basic {base64.b64encode(pair).decode('ascii')}"

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        header = self.header()
        if header is not None:
            request.headers["Authorization"] = header
        yield request


def tls_verify(settings: SourceSettings) -> ssl.SSLContext | bool:
    """Verify Prometheus's certificate (against the CA file when given) unless turned off."""
    if not settings.prometheus_tls_verify:
        return False
    if settings.prometheus_ca_file is None:
        return True
    try:
        return ssl.create_default_context(cafile=str(settings.prometheus_ca_file))
    except (OSError, ssl.SSLError) as error:
        raise InputError(
            f"TABLETUNE_SOURCE__PROMETHEUS_CA_FILE: cannot load {settings.prometheus_ca_file}: "
            f"{error}"
        ) from None


class PrometheusHttp:
    """Prometheus's query API over httpx: POST (long replica lists fit), TLS verified,
    credentials from the settings or the URL, never shown in an error."""

    def __init__(
        self, settings: SourceSettings, *, transport: httpx.BaseTransport | None = None
    ) -> None:
        assert settings.prometheus_url is not None
        url = httpx.URL(settings.prometheus_url)
        auth: httpx.Auth = PrometheusAuth(settings)
        if url.username:  # credentials in the URL: used as basic auth, kept out of messages
            auth = httpx.BasicAuth(url.username, url.password)
            url = url.copy_with(username=None, password=None)
        self._url = str(url).rstrip("/") + "/api/v1/query"
        self._http = httpx.Client(
            timeout=settings.timeout_s, auth=auth, verify=tls_verify(settings), transport=transport
        )

    def custom_query(self, query: str, params: dict[str, Any] | None = None) -> Any:
        try:
            response = self._http.post(self._url, data={"query": query, **(params or {})})
        except httpx.HTTPError as error:
            raise TemporaryError(f"{self._url}: {type(error).__name__}: {error}") from None
        if response.status_code != 200:
            raise TemporaryError(f"{self._url}: HTTP {response.status_code}: {response.text[:200]}")
        body = response.json()
        if body.get("status") != "success":
            raise TemporaryError(f"{self._url}: {body.get('error', body)!s:.200}")
        return body["data"]["result"]

    def close(self) -> None:
        self._http.close()
