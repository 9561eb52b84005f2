""".ci/run installs the servers the tests need without starting the packages' services, and stops
nothing on the machine: it used to ``pkill -x prometheus``, which stopped every Prometheus there.

The install branch runs for real here, over stand-ins for apt-get and make on PATH: the
stand-in apt-get asks the policy-rc.d the way a maintainer script's invoke-rc.d does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .conftest import REPO

SCRIPT = REPO / ".ci" / "run"
APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$CALLS"
if [ "$1" = install ]; then
  if [ -x "$POLICY_RC_D" ]; then "$POLICY_RC_D" prometheus start; echo "policy says $?" >> "$CALLS"
  else echo "no policy" >> "$CALLS"; fi
fi
"""
MAKE = '#!/bin/sh\necho "make $*" >> "$CALLS"\n'


def test_it_kills_nothing_by_name() -> None:
    code = [line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if re.search(r"\b(pkill|killall|kill)\b", line)]


def _run(tmp_path: Path, policy: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("apt-get", APT_GET), ("make", MAKE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    for tool in ("dirname", "chmod", "rm", "sh", "bash"):  # and no prometheus: it must install
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).unlink(missing_ok=True)
        (bin_dir / tool).symlink_to(found)
    calls = tmp_path / "calls.txt"
    calls.unlink(missing_ok=True)
    env = {"PATH": str(bin_dir), "CALLS": str(calls), "POLICY_RC_D": str(policy)}
    done = subprocess.run(
        [str(bin_dir / "bash"), str(SCRIPT)],
        env={**env, "HOME": os.environ.get("HOME", "/tmp")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_packages_are_installed_with_their_services_forbidden_to_start(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    done, calls = _run(tmp_path, policy)
    assert done.returncode == 0, done.stderr
    install = next(call for call in calls if call.startswith("apt-get install"))
    assert "prometheus" in install and "prometheus-alertmanager" in install
    assert "policy says 101" in calls  # "action forbidden": no service started
    assert calls[-1] == "make test"
    assert not policy.exists()  # only its own file, removed again


def test_someone_elses_policy_is_left_alone(tmp_path: Path) -> None:
    policy = tmp_path / "policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 0\n")
    policy.chmod(0o755)
    done, calls = _run(tmp_path, policy)
    assert done.returncode == 0, done.stderr
    assert "policy says 0" in calls and policy.read_text() == "#!/bin/sh\nexit 0\n"
    assert "exists" in done.stderr
