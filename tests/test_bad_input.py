"""Bad input: a one-line error naming the problem and the fix, exit code 2, and nothing written."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd
import pytest
from conftest import run, train_cmd

from horovod_train import synthetic


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with a digest of its content."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def csv_file(tmp_path: Path, frame: pd.DataFrame) -> str:
    path = tmp_path / "data.csv"
    frame.to_csv(path, index=False)
    return str(path)


def good_frame(n: int = 40) -> pd.DataFrame:
    return pd.DataFrame(synthetic.generate(n, seed=0))


CASES = {
    "unknown engine": lambda tmp: (["--engine", "mxnet"], "unknown engine"),
    "unknown config key": lambda tmp: (
        ["--config", str(_write(tmp / "c.yaml", "learning_rat: 1e-4\n"))],
        "unknown key",
    ),
    "missing train file": lambda tmp: (["--train_file", str(tmp / "missing.csv")], "does not exist"),
    "csv without nli columns": lambda tmp: (
        ["--train_file", csv_file(tmp, pd.DataFrame({"text": ["a b"], "y": [1]}))],
        "lacks column",
    ),
    "label out of range": lambda tmp: (
        ["--train_file", csv_file(tmp, good_frame().assign(label=[0, 1, 2, 5] * 10))],
        "outside 0..2",
    ),
    "empty dataset": lambda tmp: (["--train_file", csv_file(tmp, good_frame().head(0))], "no examples"),
    "batch size 0": lambda tmp: (["--per_device_train_batch_size", "0"], "must be > 0"),
}


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def assert_refused(proc, expected: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit {proc.returncode}: {proc.stderr[-2000:]}"
    assert len(lines) == 1, f"expected one line, got:\n{proc.stderr}"
    assert lines[0].startswith("error: ") and expected in lines[0] and "; fix: " in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_and_nothing_is_written(case, tmp_path, cache_dir):
    args, expected = CASES[case](tmp_path)
    out = tmp_path / "out"
    before = snapshot(tmp_path)
    # --engine single keeps these fast; a later --engine in args wins.
    proc = run(train_cmd("--engine", "single", *args, "--output_dir", str(out)), cache_dir, timeout=120)
    assert_refused(proc, expected)
    assert not out.exists()
    assert snapshot(tmp_path) == before


def test_earlier_run_is_not_overwritten_without_the_flag(tmp_path, cache_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "eval_results.json").write_text('{"accuracy": 0.9}\n')
    (out / "model.safetensors").write_bytes(b"weights of an earlier run")
    before = snapshot(out)
    proc = run(train_cmd("--engine", "single", "--output_dir", str(out)), cache_dir, timeout=120)
    assert_refused(proc, "already holds files of an earlier run")
    assert snapshot(out) == before


def test_debug_shows_the_traceback(tmp_path, cache_dir):
    proc = run(train_cmd("--engine", "nope", "--output_dir", str(tmp_path / "o"), "--debug"), cache_dir)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "unknown engine" in proc.stderr
