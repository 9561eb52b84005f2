"""systemd/: `systemd-analyze verify` on the unit and on the vLLM drop-in, plus the facts the
daemon and the engine rely on (notify + watchdog, state directory, plugins, starting table).

verify refuses a unit whose ExecStart binary does not exist, and the unit names where operators
install TableTune (/opt/tabletune), so the test verifies a temporary copy whose ExecStart points
at this environment's own ``tabletune`` script; nothing else is changed. The same goes for the
drop-in: its /opt/vllm/bin is pointed at a folder of stand-ins (python, vllm).
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tabletune.daemon.settings import StateSettings
from tabletune.schemas.table import normalize_ranges

from .conftest import SYSTEMD, explain, run_tool

UNIT = SYSTEMD / "tabletune.service"
DROP_IN = SYSTEMD / "vllm-tabletune.conf"
INSTALLED_TABLETUNE = "/opt/tabletune/bin/tabletune"
INSTALLED_VLLM_BIN = "/opt/vllm/bin"


def _tabletune_script() -> str:
    script = Path(sys.executable).parent / "tabletune"
    found = str(script) if script.exists() else shutil.which("tabletune")
    assert found, "the tabletune console script is not installed (pip install -e .)"
    return found


def _directives(text: str) -> dict[str, list[str]]:
    """Key -> values in order, continuation lines joined (enough for our own files)."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def _verify(tool: Callable[[str], str], unit: Path) -> None:
    # verify exits 0 on unknown keys or bad values (it logs "ignoring"): any output is a failure.
    result = run_tool([tool("systemd-analyze"), "verify", unit.name], cwd=unit.parent)
    assert result.returncode == 0, explain(result)
    assert result.stdout.strip() == "" and result.stderr.strip() == "", explain(result)


def _unit_copy(tmp_path: Path, text: str | None = None) -> Path:
    text = UNIT.read_text() if text is None else text
    assert f"ExecStart={INSTALLED_TABLETUNE} daemon" in text
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(INSTALLED_TABLETUNE, _tabletune_script()))
    return copy


def test_unit_verifies(tool: Callable[[str], str], tmp_path: Path) -> None:
    _verify(tool, _unit_copy(tmp_path))


def test_verify_catches_a_misspelt_hardening_key(
    tool: Callable[[str], str], tmp_path: Path
) -> None:
    broken = UNIT.read_text().replace("ProtectSystem=strict", "ProtectSytem=strict")
    with pytest.raises(AssertionError, match="Unknown key"):
        _verify(tool, _unit_copy(tmp_path, broken))


def test_unit_is_hardened_enough(tool: Callable[[str], str], tmp_path: Path) -> None:
    # systemd's own exposure score (0 = locked down, 10 = unprotected); 1.3 when written.
    result = run_tool(
        [tool("systemd-analyze"), "security", "--offline=true", "--no-pager", UNIT.name],
        cwd=_unit_copy(tmp_path).parent,
    )
    assert result.returncode == 0, explain(result)
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match, explain(result)
    assert float(match.group(1)) <= 2.0, explain(result)


def test_unit_runs_the_daemon_as_the_issue_asks() -> None:
    d = _directives(UNIT.read_text())
    assert d["Type"] == ["notify"]
    assert int(d["WatchdogSec"][0]) > 0
    assert d["Restart"] == ["on-failure"]
    assert d["EnvironmentFile"] == ["/etc/tabletune/tabletune.env"]
    assert d["DynamicUser"] == ["yes"]
    assert d["StateDirectory"] == ["tabletune"]
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
    }.items():
        assert d[key] == [value], key
    families = set(d["RestrictAddressFamilies"][0].split())
    assert families == {"AF_UNIX", "AF_INET", "AF_INET6"}  # AF_UNIX: sd_notify


def test_state_directory_is_the_daemons_default_state_dir() -> None:
    default = StateSettings().dir
    assert default == Path("/var/lib") / _directives(UNIT.read_text())["StateDirectory"][0]


def _drop_in_setup(tmp_path: Path) -> Path:
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    (stand_ins / "python").symlink_to(sys.executable)
    (stand_ins / "vllm").symlink_to(sys.executable)
    service_dir = tmp_path / "units"
    (service_dir / "vllm.service.d").mkdir(parents=True)
    (service_dir / "vllm.service").write_text(
        "[Unit]\nDescription=stand-in for the site's vLLM unit\n\n"
        f"[Service]\nExecStart={sys.executable} -c pass\n"
    )
    text = DROP_IN.read_text()
    assert INSTALLED_VLLM_BIN in text
    (service_dir / "vllm.service.d" / "tabletune.conf").write_text(
        text.replace(INSTALLED_VLLM_BIN, str(stand_ins))
    )
    return service_dir / "vllm.service"


def test_vllm_drop_in_verifies(tool: Callable[[str], str], tmp_path: Path) -> None:
    _verify(tool, _drop_in_setup(tmp_path))


def test_verify_reads_the_drop_in(tool: Callable[[str], str], tmp_path: Path) -> None:
    # Proof that the check above looked at the drop-in: a bad key there must be reported.
    unit = _drop_in_setup(tmp_path)
    conf = unit.parent / "vllm.service.d" / "tabletune.conf"
    conf.write_text(conf.read_text() + "Enviroment=X=1\n")
    with pytest.raises(AssertionError, match="Unknown key"):
        _verify(tool, unit)


def _environment(text: str) -> dict[str, str]:
    return dict(value.split("=", 1) for value in _directives(text)["Environment"])


def test_drop_in_enables_the_plugins_and_the_v2_runner() -> None:
    env = _environment(DROP_IN.read_text())
    assert env["VLLM_PLUGINS"].split(",") == [
        "tabletune_engine",
        "tabletune_http",
        "tabletune_metrics",
    ]
    assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"


def test_drop_in_plugin_names_are_the_packaged_entry_points() -> None:
    pyproject = (SYSTEMD.parent / "pyproject.toml").read_text()
    for name in _environment(DROP_IN.read_text())["VLLM_PLUGINS"].split(","):
        assert re.search(rf"^{name} = ", pyproject, re.MULTILINE), name


def test_drop_in_starting_table_holds_every_k_up_to_K() -> None:
    exec_start = [v for v in _directives(DROP_IN.read_text())["ExecStart"] if v]
    assert len(exec_start) == 1
    argv = shlex.split(exec_start[0])
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    max_num_seqs = int(argv[argv.index("--max-num-seqs") + 1])
    big_k = config["num_speculative_tokens"]
    ranges = normalize_ranges(config["num_speculative_tokens_per_batch_size"], max_k=big_k)
    assert {k for _, _, k in ranges} == set(range(big_k + 1))
    assert ranges[-1][1] == max_num_seqs
