"""Loading and saving schema files: one clear error naming the file and field, or a whole
object. Never a traceback, never a half-loaded object."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tabletune.errors import InputError
from tabletune.schemas.acceptance import AcceptanceProfile
from tabletune.schemas.profile import Profile
from tabletune.schemas.table import Table, TableError

ModelT = TypeVar("ModelT", bound=BaseModel)


def _read_json(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(
            f"{path}: not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None


def describe_validation_error(error: ValidationError) -> str:
    """First problem of a pydantic error as 'field.path: message' (+ how many more)."""
    problems = error.errors()
    first = problems[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
    return f"{where}: {first['msg']}{more}"


def _validate(path: Path, data: object, model: type[ModelT], kind: str) -> ModelT:
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object for a {kind}")
    found = data.get("kind")
    if found is not None and found != f"tabletune.{kind}":
        raise InputError(f"{path}: kind: this is a {found!r} file, expected 'tabletune.{kind}'")
    version = data.get("schema_version")
    if version is not None and version != 1:
        raise InputError(
            f"{path}: schema_version: {version!r} is not supported by this TableTune (supported: 1)"
        )
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise InputError(f"{path}: {describe_validation_error(error)}") from None


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    return _validate(path, _read_json(path), Profile, "profile")


def load_acceptance(path: str | Path) -> AcceptanceProfile:
    path = Path(path)
    return _validate(path, _read_json(path), AcceptanceProfile, "acceptance")


def load_table(spec: str, *, max_k: int | None = None) -> Table:
    """A table from a file path, inline JSON, or ``docs`` (vLLM's documented EAGLE table)."""
    text = spec
    source = "inline table"
    candidate = Path(spec)
    if spec.strip() != "docs" and not spec.lstrip().startswith(("[", "{")):
        if not candidate.exists():
            raise InputError(f"{spec}: not a file, inline JSON table, or 'docs'")
        try:
            text = candidate.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InputError(f"{spec}: cannot read: {error}") from None
        source = spec
    try:
        return Table.parse_text(text, max_k=max_k)
    except TableError as error:
        raise InputError(f"{source}: {error}") from None


def save_model(model: BaseModel, path: str | Path, *, mode: int = 0o644) -> None:
    """Write JSON atomically (temp file, fsync, rename): a crash leaves the old file or the new.
    ``mode``: profiles are read by other users (e.g. the daemon's) by default."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = model.model_dump_json(indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes 0600
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
