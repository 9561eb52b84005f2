"""Profile/acceptance files: a clear error naming the file and field, or a whole object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tabletune.errors import InputError
from tabletune.schemas import load_acceptance, load_profile, load_table, save_model

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"


def _sample() -> dict:  # type: ignore[type-arg]
    return json.loads(SAMPLE.read_text())


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


def test_sample_profile_loads_and_round_trips(tmp_path: Path) -> None:
    profile = load_profile(SAMPLE)
    assert profile.metadata.sample is True
    assert profile.step_matrix().shape == (len(profile.ks), len(profile.batch_grid))
    out = tmp_path / "copy.json"
    save_model(profile, out)
    assert load_profile(out) == profile


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["metadata"].pop("gpu"), "metadata.gpu: Field required"),
        (lambda d: d.update(schema_version=7), "schema_version: 7 is not supported"),
        (lambda d: d.update(kind="tabletune.acceptance"), "kind:"),
        (lambda d: d["cells"].pop(), "missing"),
        (lambda d: d["cells"][0].update(step_ms=-1), "cells.0.step_ms"),
        (lambda d: d.update(batch_grid=[4, 2]), "strictly increasing"),
        (lambda d: d["metadata"].update(max_num_seqs=8), "max_num_seqs"),
        (lambda d: d["acceptance"].update(rates=[0.5, 0.7, 0.2]), "non-increasing"),
    ],
)
def test_broken_profile_names_file_and_field(tmp_path: Path, mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = _sample()
    mutate(data)
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)
    assert message in str(caught.value)


def test_unreadable_files_give_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="file not found"):
        load_profile(tmp_path / "nope.json")
    with pytest.raises(InputError, match="not valid JSON"):
        load_profile(_write(tmp_path, "{not json"))
    with pytest.raises(InputError, match="expected a JSON object"):
        load_acceptance(_write(tmp_path, [1, 2]))


def test_acceptance_rates_must_be_probabilities(tmp_path: Path) -> None:
    path = _write(tmp_path, {"rates": [1.2]})
    with pytest.raises(InputError, match=r"rates.*outside"):
        load_acceptance(path)


def test_load_table_from_file_inline_and_docs(tmp_path: Path) -> None:
    table_file = tmp_path / "t.json"
    table_file.write_text("[[1, 32, 2], [33, 64, 0]]")
    assert load_table(str(table_file)).ranges == ((1, 32, 2), (33, 64, 0))
    assert load_table("[[1,4,1]]").ranges == ((1, 4, 1),)
    assert load_table("docs").max_k == 3
    with pytest.raises(InputError, match="not a file"):
        load_table("missing.json")
    table_file.write_text("[[2, 32, 2]]")
    with pytest.raises(InputError, match=r"t\.json: the first range must start at 1"):
        load_table(str(table_file))


def test_save_is_atomic_and_leaves_no_temp_files(tmp_path: Path) -> None:
    profile = load_profile(SAMPLE)
    save_model(profile, tmp_path / "a.json")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o644
