"""Executed notebook -> standalone HTML with the code hidden and, on failure, a red banner on top."""

from __future__ import annotations

import html as htmlmod
from pathlib import Path

import nbformat
from nbconvert import HTMLExporter

from ..fileio import write_text_atomic

BANNER_ID = "workbench-failure"
ERROR_TAG = "workbench-error"    # the lab template turns it into the class "celltag_workbench-error"


def render_html(ipynb: Path, html: Path, *, status: str, reason: str) -> Path:
    """Write ``html`` from ``ipynb`` (lab template, inputs excluded, images inlined as data: URIs).

    A failed run gets a first cell ``<div id="workbench-failure">`` holding the status and reason,
    so a reader (and the browser test) sees the failure without scrolling to it. Every cell with
    an error output is tagged ERROR_TAG (the runner has already moved stderr text to the log).
    """
    nb = nbformat.read(ipynb, as_version=4)
    for cell in nb.cells:
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            cell.metadata.setdefault("tags", []).append(ERROR_TAG)
    if status != "ok":
        text = f"<b>This notebook did not finish: {htmlmod.escape(status)}</b><br>{htmlmod.escape(reason)}"
        banner = nbformat.v4.new_markdown_cell(
            f'<div id="{BANNER_ID}" style="color:#a00; border:2px solid #a00; padding:8px">{text}</div>')
        nb.cells.insert(0, banner)
    exporter = HTMLExporter(template_name="lab", exclude_input=True, exclude_input_prompt=True,
                            exclude_output_prompt=True)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb.stem}})
    return write_text_atomic(html, body)
