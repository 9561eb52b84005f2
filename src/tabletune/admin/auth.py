"""Who may use the admin API: one set of rules for the vLLM plugin and the emulator. Pure, but
for ``read_token_file`` and ``auth_from_env`` (start-up only).

- A token configured (``TABLETUNE_ADMIN_TOKEN`` or ``TABLETUNE_ADMIN_TOKEN_FILE``, or vLLM's own
  ``--api-key`` / ``VLLM_API_KEY``): every route needs ``Authorization: Bearer <one of them>``.
- A token configured but unusable (a placeholder, too short, an unreadable file): every route
  answers 403 with the reason. Fail closed, never open.
- No token: reads are open, writes are refused unless ``TABLETUNE_ADMIN_OPEN=loopback``, and
  then only from a loopback client that addressed the server by a loopback name (a browser
  page that rebinds its own name to 127.0.0.1 still sends that name as Host).
- Browsers are refused separately (``cross_origin_problem``): vLLM answers CORS with ``*``.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tabletune.admin.state import AdminError
from tabletune.errors import InputError

TOKEN_ENV = "TABLETUNE_ADMIN_TOKEN"
TOKEN_FILE_ENV = "TABLETUNE_ADMIN_TOKEN_FILE"
OPEN_ENV = "TABLETUNE_ADMIN_OPEN"
OPEN_LOOPBACK = "loopback"
VLLM_API_KEY_ENV = "VLLM_API_KEY"
MIN_TOKEN_LENGTH = 16
# Words of the examples' placeholders (docs, deploy/kubernetes): copied as is, they would be
# the same "secret" on every installation.
PLACEHOLDER_WORDS = ("change-me", "changeme", "replace-me", "replaceme", "placeholder")
MAX_TOKEN_FILE_BYTES = 4096
LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot protect the admin API, or None when it can."""
    if not token:
        return "is empty"
    if not all("!" <= char <= "~" for char in token):
        return "must be printable ASCII without spaces (it travels in an HTTP header)"
    lowered = token.lower()
    if any(word in lowered for word in PLACEHOLDER_WORDS):
        return "is a placeholder from the examples; generate one (openssl rand -hex 32)"
    if len(token) < MIN_TOKEN_LENGTH:
        return f"is shorter than {MIN_TOKEN_LENGTH} characters"
    return None


def read_token_file(path: str) -> str:
    """The token in ``path``, surrounding whitespace (a final newline) dropped."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as error:
        raise InputError(f"{TOKEN_FILE_ENV}={path}: cannot read it: {error.strerror}") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise InputError(f"{TOKEN_FILE_ENV}={path}: larger than {MAX_TOKEN_FILE_BYTES} bytes")
    try:
        return raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise InputError(f"{TOKEN_FILE_ENV}={path}: the token must be ASCII") from None


def own_token(token: str | None, token_file: str | Path | None) -> str | None:
    """The admin token set by ``TABLETUNE_ADMIN_TOKEN`` or ``TABLETUNE_ADMIN_TOKEN_FILE``
    (None: neither is set); ``InputError`` says why it cannot be used."""
    if token and token_file:
        raise InputError(f"set {TOKEN_ENV} or {TOKEN_FILE_ENV}, not both")
    if token_file:
        value, source = read_token_file(str(token_file)), f"{TOKEN_FILE_ENV}={token_file}"
    elif token:
        value, source = token.strip(), TOKEN_ENV
    else:
        return None
    problem = token_problem(value)
    if problem is not None:
        raise InputError(f"{source}: the admin token {problem}")
    return value


@dataclass(frozen=True)
class AdminAuth:
    """The admin API's access rules on one server, decided once at start-up."""

    tokens: tuple[str, ...] = field(default=(), repr=False)  # never in a log line
    open_loopback: bool = False
    closed: str | None = None
    notes: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the start-up log."""
        if self.closed is not None:
            return f"CLOSED, every request refused: {self.closed}"
        if self.tokens:
            text = f"bearer token required ({len(self.tokens)} accepted)"
        elif self.open_loopback:
            text = f"no token; writes only from this machine ({OPEN_ENV}={OPEN_LOOPBACK})"
        else:
            text = f"no token: reads open, writes refused (set {TOKEN_ENV})"
        return "; ".join((text, *self.notes))


def build_auth(
    *, token: str | None, api_keys: Sequence[str] = (), open_value: str | None = None
) -> AdminAuth:
    """The rules from a usable own ``token`` (see ``own_token``), vLLM's API keys and the value
    of ``TABLETUNE_ADMIN_OPEN``."""
    if open_value and open_value != OPEN_LOOPBACK:
        return AdminAuth(closed=f"{OPEN_ENV}={open_value!r}: the only value is {OPEN_LOOPBACK!r}")
    weak = [problem for key in api_keys if (problem := token_problem(key)) is not None]
    tokens = ((token,) if token else ()) + tuple(k for k in api_keys if token_problem(k) is None)
    if not tokens and weak:
        return AdminAuth(
            closed=f"vLLM's --api-key/{VLLM_API_KEY_ENV} {weak[0]}, so it cannot serve as the "
            f"admin token; set {TOKEN_ENV}"
        )
    notes: list[str] = []
    if weak:
        notes.append(f"{len(weak)} of vLLM's API keys not accepted for the admin API (weak)")
    if tokens and open_value:
        notes.append(f"{OPEN_ENV} ignored: a token is set")
    return AdminAuth(
        tokens=tokens, open_loopback=not tokens and open_value == OPEN_LOOPBACK, notes=tuple(notes)
    )


def auth_from_env(env: Mapping[str, str], *, api_keys: Sequence[str] = ()) -> AdminAuth:
    """The rules for a server started with ``env`` (a token file is read now)."""
    try:
        token = own_token(env.get(TOKEN_ENV) or None, env.get(TOKEN_FILE_ENV) or None)
    except InputError as error:
        return AdminAuth(closed=str(error))
    return build_auth(token=token, api_keys=api_keys, open_value=env.get(OPEN_ENV) or None)


@dataclass(frozen=True)
class Caller:
    """What the rules look at in one request."""

    write: bool
    authorization: str | None = None
    client_host: str | None = None
    host: str | None = None  # the Host header


def authorize(auth: AdminAuth, caller: Caller) -> None:
    """Raise ``AdminError`` (401/403) unless ``auth`` lets ``caller`` in."""
    if auth.closed is not None:
        raise AdminError(403, f"admin API closed: {auth.closed}")
    if auth.tokens:
        if not _bearer_matches(caller.authorization, auth.tokens):
            raise AdminError(401, "missing or wrong admin token (Authorization: Bearer <token>)")
        return
    if not caller.write:
        return
    if not auth.open_loopback:
        raise AdminError(
            403,
            f"this server has no admin token, so writes are refused: set {TOKEN_ENV} "
            f"(or {OPEN_ENV}={OPEN_LOOPBACK} for a local test)",
        )
    if not (is_loopback_address(caller.client_host) and is_loopback_host(caller.host)):
        raise AdminError(
            403,
            f"{OPEN_ENV}={OPEN_LOOPBACK} takes writes only from this machine, addressed as "
            "localhost, 127.0.0.1 or [::1]",
        )


def _bearer_matches(header: str | None, tokens: Sequence[str]) -> bool:
    scheme, _, given = (header or "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    given_bytes = given.strip().encode("utf-8", "replace")
    matched = False
    for token in tokens:  # every token compared: the time does not tell which one is close
        matched |= hmac.compare_digest(given_bytes, token.encode())
    return matched


def is_loopback_address(host: str | None) -> bool:
    try:
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))


def is_loopback_host(host: str | None) -> bool:
    """A Host header naming this machine: localhost, 127.x.y.z or [::1], any port."""
    if host is None or "@" in host:
        return False
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:
        return False
    return name is not None and (name in LOOPBACK_NAMES or is_loopback_address(name))


def cross_origin_problem(method: str, origin: str | None, host: str | None) -> str | None:
    """Why a request that carries ``Origin`` (a browser's) is refused, or None. vLLM adds
    CORSMiddleware with ``allow_origins=["*"]`` by default, so a web page could otherwise
    preflight and then PUT; the admin API is not for browsers."""
    if origin is None:
        return None
    if method == "OPTIONS":
        return "CORS preflight refused: the admin API does not serve browsers"
    try:
        parts = urlsplit(origin)
    except ValueError:
        parts = None
    same = (
        parts is not None
        and parts.scheme in ("http", "https")
        and bool(host)
        and parts.netloc.lower() == str(host).lower()
    )
    if not same:
        return f"cross-origin request refused (Origin {origin[:100]!r}): not for browsers"
    return None
