"""Checkpoints: exact resume mid-epoch, corruption and mismatch detection, atomic writes."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from support.checkpoints import SAVED
from support.jobs import SMALL_JOB

from horovod_train.common.errors import UsageError
from horovod_train.models import lora
from horovod_train.outputs import checkpoint as ckpt

pytestmark = pytest.mark.slow


def test_a_global_batch_split_otherwise_and_an_elastic_run_are_accepted():
    """2 ranks x 16 x accumulation 2 resumes 4 x 16 x 1 (the same global batch: the samplers give each step
    the same examples); an elastic run (global batch None) resumes at any world size."""
    SAVED.check(dataclasses.asdict(SAVED), Path("checkpoint-6"))
    dataclasses.replace(SAVED, global_batch=None).check({**dataclasses.asdict(SAVED), "global_batch": 8}, Path("c"))


def test_a_checkpoint_from_before_the_data_checks_resumes_with_a_warning():
    old = {k: v for k, v in dataclasses.asdict(SAVED).items() if k not in ckpt.Compatibility.ADDED_LATER}
    warnings: list[str] = []
    SAVED.check(old, Path("out/checkpoint-6"), warn=warnings.append)
    assert warnings == [
        "warning: checkpoint out/checkpoint-6 predates the checks of tokenizer, label_names, train_data, seed, "
        "group_by_length: resuming without them"
    ]
    with pytest.raises(UsageError, match="vocab_size"):  # what old checkpoints recorded is still checked
        SAVED.check({**old, "vocab_size": 299}, Path("out/checkpoint-6"), warn=warnings.append)


def test_a_tokenizer_digest_of_the_earlier_form_resumes_with_a_warning():
    """Checkpoints of before issue 34 know their tokenizer by class and vocabulary alone: not comparable with
    today's digest, so not checked (a warning), where a mismatch of today's form is refused."""
    ours = dataclasses.replace(SAVED, tokenizer="tokenizer-v2:0a1b")
    warnings: list[str] = []
    ours.check({**dataclasses.asdict(SAVED), "tokenizer": "7c3f9e"}, Path("out/checkpoint-6"), warn=warnings.append)
    assert warnings == ["warning: checkpoint out/checkpoint-6 predates the checks of tokenizer: resuming without them"]
    with pytest.raises(UsageError, match="saved with tokenizer='tokenizer-v2:0a1c' but this run has"):
        ours.check({**dataclasses.asdict(SAVED), "tokenizer": "tokenizer-v2:0a1c"}, Path("c"), warn=warnings.append)


def synthetic_csv(path: Path, seed: int) -> Path:
    import pandas as pd

    from horovod_train.data import synthetic

    pd.DataFrame(synthetic.generate(600, seed=seed)).to_csv(path, index=False)
    return path


def train_in_process(*args: str) -> int:
    from horovod_train.cli.main import main

    return main(["train", "--engine", "single", *SMALL_JOB, "--max_steps", "4", "--save_steps", "2", *args])


@pytest.fixture
def in_process(cache_dir, monkeypatch):
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def refused_line(capsys, out: Path, *args: str) -> str:
    """Resume ``out`` from its mid-run checkpoint with ``args``: one error line, exit 2, the directory untouched."""
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        train_in_process(*args, "--output_dir", str(out), "--resume_from_checkpoint", str(out / "checkpoint-2"))
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return err[0]


def test_resume_on_other_texts_with_a_tiny_bert_tokenizer_of_the_same_size_is_refused(tmp_path, in_process, capsys):
    """Two tiny-bert tokenizers trained on other texts have the same size (298) and other ids: the vocabulary
    size check let this resume train on what the checkpoint's embeddings never meant."""
    out = tmp_path / "run"
    assert train_in_process("--train_file", str(synthetic_csv(tmp_path / "a.csv", 42)), "--output_dir", str(out)) == 0
    line = refused_line(capsys, out, "--train_file", str(synthetic_csv(tmp_path / "b.csv", 7)))
    assert "error: checkpoint" in line and "saved with tokenizer=" in line, line


def test_resume_on_other_data_with_the_same_tokenizer_is_refused(tmp_path, in_process, capsys):
    from horovod_train.data import synthetic
    from horovod_train.models import model as model_lib

    tokenizer = tmp_path / "tokenizer"
    model_lib.prepare_tiny_tokenizer(tokenizer, [r["premise"] for r in synthetic.generate(600, seed=1)])
    out, same = tmp_path / "run", ["--tokenizer_name", str(tokenizer)]
    assert train_in_process(*same, "--train_file", str(synthetic_csv(tmp_path / "a.csv", 42)), "--output_dir",
                            str(out)) == 0  # fmt: skip
    line = refused_line(capsys, out, *same, "--train_file", str(synthetic_csv(tmp_path / "b.csv", 7)))
    assert "saved with train_data=" in line and "the same training data" in line, line
    line = refused_line(capsys, out, *same, "--train_file", str(tmp_path / "a.csv"), "--seed", "7")
    assert "saved with seed=42 but this run has seed=7" in line, line
    line = refused_line(capsys, out, *same, "--train_file", str(tmp_path / "a.csv"), "--group_by_length")
    assert "saved with group_by_length=False but this run has group_by_length=True" in line, line


LORA = ["--use_peft", "--lora_r", "4"]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, cache_dir) -> Path:
    """A LoRA run with peft's defaults for BERT (alpha 16, dropout 0.05, query and value), checkpoints 2 and 4."""
    out = tmp_path_factory.mktemp("lora") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
        patch.setenv("HF_HUB_OFFLINE", "1")
        assert train_in_process(*LORA, "--output_dir", str(out)) == 0
    return out


@pytest.mark.parametrize(
    ("changed", "expected"),
    [
        (["--lora_r", "8"], "saved with lora_r=4 but this run has lora_r=8; fix: resume with --lora_r 4 as"),
        (
            ["--lora_target_modules", "query,key"],
            "saved with lora_target_modules=['query', 'value'] but this run has lora_target_modules=['key', 'query']; "
            "fix: resume with --lora_target_modules query,value as",
        ),
        (
            ["--lora_alpha", "32"],
            "saved with lora_alpha=16 but this run has lora_alpha=32; fix: resume with --lora_alpha 16",
        ),
        (["--lora_dropout", "0.1"], "saved with lora_dropout=0.05 but this run has lora_dropout=0.1; fix: resume with"),
    ],
)
def test_a_lora_resume_with_other_lora_settings_is_refused(lora_run, in_process, capsys, changed, expected):
    """Another --lora_r or --lora_target_modules ended in a size-mismatch traceback; another --lora_alpha or
    --lora_dropout resumed silently, its adapters computing otherwise than they were trained to."""
    line = refused_line(capsys, lora_run, *LORA, *changed)
    assert line.startswith("error: checkpoint") and expected in line, line


def test_a_lora_checkpoint_resumed_without_use_peft_is_refused_and_peft_defaults_may_be_named(
    lora_run, tmp_path, in_process, capsys
):
    out = tmp_path / "run"
    shutil.copytree(lora_run, out)
    line = refused_line(capsys, out)
    assert "saved with use_peft=True but this run has use_peft=False; fix: resume with --use_peft as" in line, line
    # peft's default target modules for BERT, named (in another order): the same model, resumed.
    resumed = ["--resume_from_checkpoint", str(out / "checkpoint-2"), "--lora_target_modules", "value,query"]
    assert train_in_process(*LORA, *resumed, "--output_dir", str(out)) == 0
    assert "resumed from step 2" in capsys.readouterr().out


def test_a_lora_checkpoint_from_before_the_lora_checks_resumes_with_a_warning():
    saved = dataclasses.replace(SAVED, architecture="PeftModelForSequenceClassification", use_peft=True, lora_r=4,
                                lora_alpha=16, lora_dropout=0.05, lora_target_modules=["query", "value"])  # fmt: skip
    old = {k: v for k, v in dataclasses.asdict(saved).items() if k not in lora.FLAGS}
    warnings: list[str] = []
    saved.check(old, Path("out/checkpoint-6"), warn=warnings.append)
    assert warnings == [
        "warning: checkpoint out/checkpoint-6 predates the checks of use_peft, lora_r, lora_alpha, lora_dropout, "
        "lora_target_modules: resuming without them"
    ]
