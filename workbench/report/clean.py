"""What the report keeps of an executed notebook: stderr stream outputs (warnings, library progress
bars, C-level writes that ipykernel forwards) move from the notebook to the run's log."""

from __future__ import annotations

from pathlib import Path

import nbformat

from ..fileio import write_text_atomic


def strip_stderr(ipynb: Path, log: Path) -> int:
    """Remove every stderr stream output from ``ipynb``, append its text to ``log``; how many went."""
    nb = nbformat.read(ipynb, as_version=4)
    moved: list[str] = []
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if "injected-parameters" not in cell.metadata.get("tags", []):
            number += 1                                  # numbered as the source notebook's code cells
        outs = cell.get("outputs", [])
        err = [o for o in outs if o.get("output_type") == "stream" and o.get("name") == "stderr"]
        if err:
            cell.outputs = [o for o in outs if o not in err]
            head = f"stderr of code cell {number} (kept out of the report):\n"
            moved += [head + o.get("text", "") for o in err]
    if moved:
        write_text_atomic(ipynb, nbformat.writes(nb))
        with open(log, "a", encoding="utf-8") as f:
            f.write("".join(m if m.endswith("\n") else m + "\n" for m in moved))
    return len(moved)
