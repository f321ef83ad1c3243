"""Models that ship their own code (config.json's auto_map) load only with --trust_remote_code, as in
run_glue.py; without it the run stops with one line that names the flag. A --token is never written out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import transformers
from support.jobs import SMALL_JOB

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.models import model as model_lib

CONFIGURATION = """
from transformers import BertConfig


class TinyClfConfig(BertConfig):
    model_type = "tinyclf"
"""
MODELING = """
from transformers import BertForSequenceClassification

from .configuration_tinyclf import TinyClfConfig


class TinyClfForSequenceClassification(BertForSequenceClassification):
    config_class = TinyClfConfig
"""
AUTO_MAP = {
    "AutoConfig": "configuration_tinyclf.TinyClfConfig",
    "AutoModelForSequenceClassification": "modeling_tinyclf.TinyClfForSequenceClassification",
}


def remote_code_model(root: Path) -> Path:
    """A checkpoint directory whose architecture is defined by the Python files beside its config.json."""
    target = root / "tinyclf"
    target.mkdir(parents=True)
    (target / "configuration_tinyclf.py").write_text(CONFIGURATION)
    (target / "modeling_tinyclf.py").write_text(MODELING)
    model_lib.train_wordpiece_tokenizer(["Ann put the cup next to the box .", "Bo sat ."] * 50, target)
    vocab = len(transformers.AutoTokenizer.from_pretrained(target))
    config = transformers.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, num_labels=3)  # fmt: skip
    transformers.BertForSequenceClassification(config).save_pretrained(target)
    saved = json.loads((target / "config.json").read_text())
    saved.update(model_type="tinyclf", architectures=["TinyClfForSequenceClassification"], auto_map=AUTO_MAP)
    (target / "config.json").write_text(json.dumps(saved))
    return target


def test_a_model_that_ships_code_needs_trust_remote_code(tmp_path):
    path = remote_code_model(tmp_path)
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    with pytest.raises(UsageError) as refused:
        model_lib.build_model(str(path), 3, ["a", "b", "c"], vocab, seed=0)
    assert "--trust_remote_code" in refused.value.fix and "\n" not in str(refused.value)
    model = model_lib.build_model(str(path), 3, ["a", "b", "c"], vocab, seed=0,
                                  access=model_lib.HubAccess(trust_remote_code=True))  # fmt: skip
    assert type(model).__name__ == "TinyClfForSequenceClassification"


def test_trust_remote_code_trains_such_a_model_from_the_command_line(tmp_path, cache_dir, monkeypatch, capsys):
    from horovod_train.cli.main import main

    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(cache_dir))
    monkeypatch.setattr(sys, "path", list(sys.path))  # transformers adds its module cache to the path
    path, out = remote_code_model(tmp_path), tmp_path / "out"
    job = [*SMALL_JOB[2:], "--model_name_or_path", str(path), "--engine", "single", "--max_steps", "3"]
    with pytest.raises(SystemExit) as exited:
        main(["train", *job, "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and "--trust_remote_code" in err[-1], err
    assert not (out / "run_config.json").exists()
    assert main(["train", *job, "--trust_remote_code", "--output_dir", str(out)]) in (0, None)
    assert json.loads((out / "config.json").read_text())["auto_map"] == AUTO_MAP


def test_a_token_is_never_written_out():
    config = parse_run_config(["--token", "hf_secret"])
    assert config.model.token == "hf_secret"
    assert "hf_secret" not in json.dumps(config.to_dict())


@pytest.fixture
def hub_not_answering(monkeypatch):
    """Online as far as the libraries know (no HF_HUB_OFFLINE), with an endpoint that refuses connections (the
    discard port): a compute node without internet. Restored after the test, whatever the probe switched."""
    import datasets
    from huggingface_hub import constants

    from horovod_train.data import glue

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(glue, "_probed", {})


def hf_cache_entry(cache: Path, repo_id: str, source: Path) -> None:
    """``source``'s files as the HF cache holds a hub model's download (models--ORG--NAME, refs/main, snapshots)."""
    commit = "0" * 40
    entry = cache / f"models--{repo_id.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    snapshot = entry / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())


def test_a_hub_name_is_not_waited_for_where_the_hub_does_not_answer(hub_not_answering, tmp_path):
    """A cached name loads from the HF cache; one that is not cached fails at once (huggingface_hub's retries took
    ~100 s), in one line that names HF_HUB_OFFLINE and a local directory instead. --dataset_name alike."""
    from horovod_train.data import glue

    cache = tmp_path / "hf-cache"
    hf_cache_entry(cache, "acme/tiny-clf", remote_code_model(tmp_path))
    tokenizer = model_lib.load_tokenizer("acme/tiny-clf", str(cache))
    model = model_lib.build_model("acme/tiny-clf", 3, ["a", "b", "c"], len(tokenizer), seed=0, cache_dir=str(cache),
                                  access=model_lib.HubAccess(trust_remote_code=True))  # fmt: skip
    assert type(model).__name__ == "TinyClfForSequenceClassification"
    for load in (
        lambda: model_lib.load_tokenizer("acme/absent-model", str(cache)),
        lambda: glue.load_hub("acme/absent-data", None, str(cache)),
    ):
        with pytest.raises(UsageError) as refused:
            load()
        line = str(refused.value)
        assert "\n" not in line and "not in the HF cache" in line and "http://127.0.0.1:9 did not answer" in line
        assert "HF_HUB_OFFLINE=1" in refused.value.fix and ("local model directory" in line or "save_to_disk" in line)
