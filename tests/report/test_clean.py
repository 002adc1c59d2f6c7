"""stderr outputs leave the executed notebook for the log; progress lines go to the log."""

from __future__ import annotations

import nbformat

from workbench.report import progress as bars
from workbench.report.clean import strip_stderr


def test_strip_stderr_moves_text_to_the_log(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# t"), nbformat.v4.new_code_cell("x = 1")]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="kept\n"),
                           nbformat.v4.new_output("stream", name="stderr", text="gone\n"),
                           nbformat.v4.new_output("error", ename="E", evalue="v", traceback=[])]
    path, log = tmp_path / "n.ipynb", tmp_path / "n.log"
    nbformat.write(nb, path)
    log.write_text("before\n")
    assert strip_stderr(path, log) == 1
    outs = nbformat.read(path, as_version=4).cells[1].outputs
    assert [o.get("name", o.output_type) for o in outs] == ["stdout", "error"]   # errors stay in the report
    assert log.read_text() == "before\nstderr of code cell 1 (kept out of the report):\ngone\n"
    assert strip_stderr(path, log) == 0 and log.read_text().count("gone") == 1


def test_progress_lines_go_to_the_named_log(tmp_path, monkeypatch, capsys):
    log = tmp_path / "run.log"
    monkeypatch.setenv(bars.ENV, str(log))
    assert sum(bars.progress(range(4), "four")) == 6
    assert capsys.readouterr() == ("", "")                 # nothing on the kernel's stdout or stderr
    lines = log.read_text().splitlines()
    assert lines and all(ln.startswith(bars.PREFIX) for ln in lines)
    assert bars.last_line(log).startswith("four: 100%|") and "4/4" in bars.last_line(log)
    assert bars.last_line(tmp_path / "missing.log") == ""
    monkeypatch.delenv(bars.ENV)
    list(bars.progress(range(2), "two"))
    assert "two: 100%" in capsys.readouterr().out          # interactively: in the cell, on stdout
