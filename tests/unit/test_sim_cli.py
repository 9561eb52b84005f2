"""``tabletune sim`` subcommands: list, check, and serve's argument errors (no server started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tabletune.cli.main import main
from tabletune.errors import InputError
from tabletune.sim.serve import parse_ports


def test_list_shows_the_packaged_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"repair", "acceptance-switch", "load-sweep", "restart"} <= set(names)


def test_check_accepts_a_packaged_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "check", "--scenario", "repair"]) == 0
    assert "repair: ok" in capsys.readouterr().out


def test_check_reports_a_bad_file_with_its_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "bad",
                "engine": {"num_speculative_tokens": 3, "max_num_seqs": 8, "starting_table": None},
                "load": {"kind": "constant", "batch_size": 4},
                "acceptance": {"kind": "switch", "before": [0.5, 0.4, 0.3], "after": [0.5]},
            }
        ),
        encoding="utf-8",
    )
    assert main(["sim", "check", "--scenario", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "acceptance.switch.at_s: Field required" in err


def test_serve_refuses_a_profile_that_does_not_cover_the_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.yaml"
    scenario = yaml.safe_load(
        (
            Path(__file__).resolve().parents[2] / "src/tabletune/sim/scenarios/steady.yaml"
        ).read_text()
    )
    scenario["engine"]["max_num_seqs"] = 1024
    scenario["profile"] = str(
        Path(__file__).resolve().parents[2] / "examples" / "sample-profile.json"
    )
    path.write_text(yaml.safe_dump(scenario), encoding="utf-8")
    assert main(["sim", "serve", "--scenario", str(path), "--port", "1"]) == 2
    assert "max_num_seqs=1024 is beyond the profile" in capsys.readouterr().err


def test_port_ranges() -> None:
    assert parse_ports(None, None) == [8000]
    assert parse_ports(9100, None) == [9100]
    assert parse_ports(None, "9000-9002") == [9000, 9001, 9002]
    for bad in ("9002-9000", "a-b", "0-3", "1-99999"):
        with pytest.raises(InputError, match="--ports"):
            parse_ports(None, bad)
    with pytest.raises(InputError, match="not both"):
        parse_ports(1, "2-3")
