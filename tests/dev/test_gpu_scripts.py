"""The device-run scripts (dev/*.sh) name only files that exist and steps they define: a typo there costs
device time, found only on the GPU machine."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _scripts():
    return sorted((ROOT / "dev").glob("*.sh"))


def test_every_path_a_device_script_names_exists():
    missing = []
    for sh in _scripts():
        text = sh.read_text()
        for path in set(re.findall(r"(?<![\w/$.])((?:dev|tests|workbench)/[\w/.-]+\.(?:py|sh))", text)):
            if not (ROOT / path).exists():
                missing.append(f"{sh.name}: {path}")
    assert _scripts() and not missing, missing


def test_device_scripts_parse_and_gpu_k2_runs_each_step_it_lists():
    for sh in _scripts():
        assert subprocess.run(["bash", "-n", str(sh)], capture_output=True).returncode == 0, sh.name
    text = (ROOT / "dev" / "gpu_k2.sh").read_text()
    header = text.split("# The wheels")[0]                          # the steps' list, before the setup notes
    listed = set(re.findall(r"^#   (\w+) ", header, re.M))
    cases = set(re.findall(r"^    (\w+)\) ", text, re.M))
    assert listed and listed <= cases, sorted(listed - cases)


def test_the_python_scripts_a_device_run_calls_import_and_answer_help():
    """Each dev script a device script runs, where it has a command line, imports and prints its help on a
    CPU machine (an import or syntax error would otherwise first show on the GPU)."""
    import os
    import sys
    called = {p for sh in _scripts() for p in re.findall(r"python3 ((?:dev)/[\w/.-]+\.py)", sh.read_text())}
    with_cli = sorted(p for p in called if "argparse" in (ROOT / p).read_text())
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}

    def helps(p: str) -> bool:
        cmd = [sys.executable, str(ROOT / p), "--help"]
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, timeout=300).returncode == 0
    failed = [p for p in with_cli if not helps(p)]
    assert len(with_cli) >= 5 and not failed, failed
