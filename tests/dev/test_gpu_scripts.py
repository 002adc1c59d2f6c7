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
