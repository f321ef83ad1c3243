"""Every bad-input case of support/bad_input.py, through `train`'s command line in the test process: a one-line
error naming the problem and the fix, exit code 2, and nothing written. tests/integration/test_bad_input.py runs a
case of each kind as a real program."""

from __future__ import annotations

import pytest
from support.bad_input import CASES, assert_one_line, snapshot

from horovod_train.cli.main import main


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_and_nothing_is_written(case, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args, expected = CASES[case](tmp_path)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    capsys.readouterr()
    # --engine single keeps these fast; a later --engine in args wins.
    with pytest.raises(SystemExit) as exited:
        main(["train", "--engine", "single", "--output_dir", str(out), *args])
    captured = capsys.readouterr()
    assert_one_line(exited.value.code, captured.err, captured.out, expected)
    assert not out.exists()
    assert snapshot(tmp_path) == before
