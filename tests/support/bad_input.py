"""Bad input to `train`, case by case: each a one-line error naming the problem and the fix, exit code 2, and nothing
written. tests/unit/test_bad_input.py runs every case in the test process; tests/integration/test_bad_input.py runs a
case of each kind as a real program (the process's exit code and stderr)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pandas as pd

from horovod_train.data import synthetic


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
        "has no column 'label' (has: text, y)",
    ),
    "label out of range": lambda tmp: (
        ["--train_file", csv_file(tmp, good_frame().assign(label=[0, 1, 2, 5] * 10))],
        "outside 0..3",
    ),
    "empty dataset": lambda tmp: (["--train_file", csv_file(tmp, good_frame().head(0))], "no examples"),
    "test file of a header alone": lambda tmp: (
        [
            "--train_file",
            csv_file(tmp, good_frame()),
            "--test_file",
            str(_write(tmp / "t.csv", "premise,hypothesis\n")),
        ],
        f"--test_file {tmp / 't.csv'} has no examples",
    ),
    "n/a among number labels": lambda tmp: (
        ["--train_file", csv_file(tmp, good_frame().assign(label=[*(f"{i / 8:.3f}" for i in range(39)), "n/a"]))],
        "row 40 holds 'n/a' where its other rows hold numbers",
    ),
    "batch size 0": lambda tmp: (["--per_device_train_batch_size", "0"], "must be > 0"),
    "malformed yaml": lambda tmp: (["--config", str(_write(tmp / "c.yaml", "learning_rate: [1e-4\n"))], "malformed"),
    "output dir inside a file": lambda tmp: (["--output_dir", str(_write(tmp / "f", "x") / "out")], "inside the file"),
    "output dir not writable": lambda tmp: (["--output_dir", "/proc/horovod-train-out"], "cannot write in /proc"),
    "missing checkpoint": lambda tmp: (["--resume_from_checkpoint", str(tmp / "checkpoint-9")], "does not exist"),
    "nccl without cuda": lambda tmp: (["--engine", "ddp", "--ddp_backend", "nccl"], "needs CUDA"),
    "tokenizer/model mismatch": lambda tmp: (
        ["--model_name_or_path", str(_small_vocab_model(tmp)), "--tokenizer_name", "bert-base-cased-absent"],
        "cannot load tokenizer",
    ),
    "elastic without horovod": lambda tmp: (["--engine", "ddp", "--elastic"], "--elastic needs --engine horovod"),
    "elastic under a sharded engine": lambda tmp: (
        ["--engine", "fsdp", "--elastic"],
        "--elastic needs --engine horovod",
    ),
    # 400B parameters: 6 TB of weights, gradients and AdamW, more than any machine this runs on; counted on the meta
    # device, so refusing it costs no memory.
    "training state beyond the memory": lambda tmp: (
        ["--config_name", str(_huge_decoder_config(tmp)), "--synthetic_num_examples", "40"],
        "--engine single needs",
    ),
    "fsdp with fp16": lambda tmp: (["--engine", "fsdp", "--fp16"], "--engine fsdp cannot use --fp16"),
    "fsdp with LoRA": lambda tmp: (["--engine", "fsdp", "--use_peft"], "--engine fsdp does not train LoRA"),
    "text in a number field": lambda tmp: (["--learning_rate", "fast"], "invalid float value"),
    "adasum with clipping": lambda tmp: (["--engine", "horovod", "--op", "adasum"], "--op adasum cannot clip"),
    "adasum with fp16": lambda tmp: (
        ["--engine", "horovod", "--op", "adasum", "--max_grad_norm", "0", "--fp16"],
        "--op adasum cannot use --fp16",
    ),
    "elastic with gradient groups": lambda tmp: (
        ["--engine", "horovod", "--elastic", "--horovod_groups", "2"],
        "--horovod_groups does not work with --elastic",
    ),
    "elastic with the autotuner": lambda tmp: (
        ["--engine", "horovod", "--elastic", "--autotune"],
        "--autotune does not work with --elastic",
    ),
    "unknown stop signal": lambda tmp: (["--checkpoint_signals", "SIGTERM,SIGNOPE"], "unknown signal"),
    "collective timeout 0": lambda tmp: (["--ddp_timeout", "0"], "--ddp_timeout must be in 1..2147483"),
    "latest without a valid checkpoint": lambda tmp: (["--resume_from_checkpoint", "latest"], "no valid checkpoint"),
    "best model with unmatched strategies": lambda tmp: (
        ["--load_best_model_at_end", "--eval_strategy", "steps", "--eval_steps", "5"],
        "needs --save_strategy equal to --eval_strategy",
    ),
    "best model saved between evaluations": lambda tmp: (
        [
            "--load_best_model_at_end",
            "--eval_strategy",
            "steps",
            "--eval_steps",
            "4",
            "--save_strategy",
            "steps",
            "--save_steps",
            "6",
        ],
        "--save_steps to be a multiple",
    ),
    "unknown metric for best model": lambda tmp: (
        ["--metric_for_best_model", "bleu"],
        "eval_bleu is not a metric of this run",
    ),
    "label smoothing of 1": lambda tmp: (["--label_smoothing_factor", "1"], "must be in [0, 1)"),
    "missing config_name": lambda tmp: (["--config_name", str(tmp / "no-config")], "cannot load config"),
    # Issue 19's list (tests/unit/test_domains.py checks every argument in-process; these go through the CLI).
    "infinite epochs": lambda tmp: (["--num_train_epochs", "inf"], "--num_train_epochs must be >= 0 and finite"),
    "nan learning rate": lambda tmp: (["--learning_rate", "nan"], "--learning_rate must be > 0"),
    "seed -1": lambda tmp: (["--seed", "-1"], "--seed must be in 0..4294967295"),
    "uncatchable stop signal": lambda tmp: (["--checkpoint_signals", "SIGKILL"], "SIGKILL cannot be caught"),
    "latin-1 config": lambda tmp: (
        ["--config", str(_write_bytes(tmp / "c.yaml", "run_name: caf\xe9\n".encode("latin-1")))],
        "is not UTF-8",
    ),
    "timeline under a file": lambda tmp: (
        ["--horovod_timeline", str(_write(tmp / "f", "x") / "t.json")],
        "lies inside the file",
    ),
    "jsonl with an int text": lambda tmp: (
        [
            "--train_file",
            str(
                _write(
                    tmp / "d.jsonl",
                    '{"premise": "a b", "hypothesis": "c", "label": 0}\n'
                    '{"premise": 7, "hypothesis": "d", "label": 1}\n',
                )
            ),
        ],
        "row 2 column 'premise' holds 7",
    ),
    "300-character output dir": lambda tmp: (["--output_dir", str(tmp / ("o" * 300))], "300-byte name"),
    "run name outside the output dir": lambda tmp: (["--run_name", str(tmp / "tb")], "outside --output_dir"),
    "config that is a directory": lambda tmp: (["--config", str(tmp)], "is a directory"),
    "empty manifest": lambda tmp: (
        ["--resume_from_checkpoint", str(_write(_mkdir(tmp / "checkpoint-3") / "manifest.json", "[]").parent)],
        "manifest.json that lists no",
    ),
    # The task shapes' (issue 21): a regression label, a multi-label cell, the threshold.
    "regression label that is not a number": lambda tmp: (
        [
            "--task_name",
            "stsb",
            "--train_file",
            str(_write(tmp / "train.csv", "sentence1,sentence2,label\na b,c d,3.5\ne f,g h,high\ni j,k l,1\n")),
        ],
        "row 2 holds 'high', which is not a number",
    ),
    "multi-label cell that is not a list": lambda tmp: (
        [
            "--train_file",
            str(
                _write(
                    tmp / "train.jsonl",
                    '{"text": "a b", "label": ["x"]}\n'
                    '{"text": "c d", "label": null}\n{"text": "e f", "label": ["y"]}\n',
                )
            ),
        ],
        "row 2 holds None, which is not a list of labels",
    ),
    "multi-label threshold outside (0, 1)": lambda tmp: (
        [
            "--multi_label_threshold",
            "1.5",
            "--train_file",
            str(_write(tmp / "train.jsonl", '{"text": "a b", "label": ["x"]}\n{"text": "e f", "label": ["y"]}\n')),
        ],
        "--multi_label_threshold must be in (0, 1)",
    ),
}


def _small_vocab_model(tmp: Path) -> Path:
    """A saved BERT whose embedding table (50 rows) is smaller than the tiny tokenizer's vocabulary."""
    from transformers import BertConfig, BertForSequenceClassification

    target = tmp / "small-vocab-model"
    config = BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3
    )
    BertForSequenceClassification(config).save_pretrained(target)
    return target


def _huge_decoder_config(tmp: Path) -> Path:
    from transformers import Qwen2Config

    target = tmp / "huge-decoder"
    Qwen2Config(hidden_size=16384, num_hidden_layers=120, intermediate_size=53248, num_attention_heads=128,
                num_key_value_heads=8, num_labels=3).save_pretrained(target)  # fmt: skip
    return target


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def assert_refused(proc, expected: str) -> None:
    """``proc`` (a CompletedProcess, or the in-process run's exit code and output) was refused in one line."""
    assert_one_line(proc.returncode, proc.stderr, proc.stdout, expected)


def assert_one_line(code: int, stderr: str, stdout: str, expected: str) -> None:
    lines = stderr.strip().splitlines()
    assert code == 2, f"exit {code}: {stderr[-2000:]}"
    assert len(lines) == 1, f"expected one line, got:\n{stderr}"
    assert lines[0].startswith("error: ") and expected in lines[0] and "; fix: " in lines[0], lines[0]
    assert "Traceback" not in stderr + stdout
