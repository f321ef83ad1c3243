"""LoRA through peft, in one process: what is trained, the merged model, the refusals."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
import transformers

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.models import lora
from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training.position import TrainingPosition

ENCODER = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
DECODER = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
               intermediate_size=64, pad_token_id=0)  # fmt: skip
CASES = {
    "bert": ("BertConfig", ENCODER, None),
    "deberta-v2": ("DebertaV2Config", ENCODER, None),
    "modernbert": ("ModernBertConfig", {**ENCODER, "pad_token_id": 0}, ("Wqkv",)),
    "llama": ("LlamaConfig", DECODER, None),
    "qwen2": ("Qwen2Config", DECODER, None),
}


def model_of(name: str) -> torch.nn.Module:
    config_class, fields, _ = CASES[name]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**fields, num_labels=3)
    return transformers.AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("name", list(CASES))
def test_only_the_adapters_and_the_head_train_and_the_merged_model_computes_the_same(name):
    options = lora.LoraOptions(r=4, alpha=8, dropout=0.0, target_modules=CASES[name][2])
    model = lora.wrap(model_of(name), options)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "modules_to_save" in n for n in trainable), sorted(trainable)
    assert any("modules_to_save" in n for n in trainable), "the classification head must train"
    params = list(model.parameters())
    count, total = sum(p.numel() for p in params if p.requires_grad), sum(p.numel() for p in params)
    assert 0 < count < total / 2
    # Move the adapters off zero (B starts at 0), as training would, then fold them in.
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    model.eval()
    ids = torch.randint(1, 64, (2, 7))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        adapted = model(input_ids=ids, attention_mask=mask).logits
        base_weights = {id(p) for n, p in model.named_parameters() if "lora_" not in n}
        plain = lora.merge_in_place(model)
        folded = plain.eval()(input_ids=ids, attention_mask=mask).logits
    assert not lora.is_peft(plain)
    # Folded into the trained model's own tensors, not into a copy of the base model.
    assert {id(p) for p in plain.parameters()} <= base_weights
    torch.testing.assert_close(adapted, folded, atol=1e-5, rtol=1e-4)


def test_a_model_peft_has_no_defaults_for_needs_target_modules():
    with pytest.raises(UsageError, match="no default LoRA target modules for modernbert") as refused:
        lora.wrap(model_of("modernbert"), lora.LoraOptions())
    assert "Wqkv" in refused.value.fix


def test_target_modules_that_do_not_exist_are_refused():
    with pytest.raises(UsageError, match="--lora_target_modules q_proj: no such linear layer") as refused:
        lora.wrap(model_of("bert"), lora.LoraOptions(target_modules=("q_proj",)))
    assert "query" in refused.value.fix


def test_use_peft_without_peft_installed_is_a_one_line_error_at_parse_time(tmp_path, monkeypatch):
    """peft is an extra (`pip install 'horovod-train[peft]'`): without it, --use_peft is refused while the
    arguments are read, before any model is built or anything is written."""
    monkeypatch.setitem(sys.modules, "peft", None)
    out = tmp_path / "out"
    with pytest.raises(UsageError) as error:
        parse_run_config(["--use_peft", "--output_dir", str(out)])
    assert error.value.problem == "--use_peft needs the peft package (not installed)"
    assert "pip install 'horovod-train[peft]'" in error.value.fix
    assert not out.exists()
    assert parse_run_config(["--output_dir", str(out)]).model.use_peft is False  # only --use_peft needs it


def trained_lora_model(name: str) -> torch.nn.Module:
    """A LoRA model as training leaves it: the adapters off zero (B starts at 0), the head moved."""
    options = lora.LoraOptions(r=4, alpha=8, dropout=0.0, target_modules=CASES[name][2])
    model = lora.wrap(model_of(name), options)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * 0.1)
    return model


@pytest.mark.parametrize("name", list(CASES))
def test_a_lora_checkpoint_loads_as_the_merged_model_and_resumes_bit_for_bit(name, tmp_path):
    """from_pretrained on a LoRA checkpoint used to find peft's names (base_model.model.*) under the base config
    and return a randomly initialised model. Now: the merged weights, the adapter beside them for peft, and a
    resume that restores the trained (unmerged) model exactly."""
    from peft import PeftModel

    model = trained_lora_model(name)
    position = TrainingPosition(global_step=6, steps_in_epoch=6)
    compatibility = ckpt.Compatibility("tiny", 3, 64, type(model).__name__, 16, **lora.settings(model))
    path = ckpt.Checkpoints(RunDirectory(tmp_path), keep=None).save(
        model, position, compatibility, {}, {"optimizer": {}, "rng": []}, write_loadable=model.config.save_pretrained
    )
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    merged = lora.merge_in_place(copy.deepcopy(model)).state_dict()

    loaded, info = transformers.AutoModelForSequenceClassification.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.state_dict().keys() == merged.keys()
    difference = max(float((loaded.state_dict()[k] - merged[k]).abs().max()) for k in merged)
    assert difference <= 1e-6, difference

    adapted = PeftModel.from_pretrained(model_of(name), path / lora.ADAPTER_DIR)  # peft's format, on the base model
    assert all(torch.equal(adapted.state_dict()[k], v) for k, v in trained.items())

    tensors, _, _ = ckpt.load_checkpoint(path)
    torch.manual_seed(7)  # another base model's initialisation: everything must come from the checkpoint
    resumed = lora.wrap(
        transformers.AutoModelForSequenceClassification.from_config(model.config),
        lora.LoraOptions(r=4, alpha=8, dropout=0.0, target_modules=CASES[name][2]),
    )
    resumed.load_state_dict(ckpt.model_state(tensors, resumed))  # strict
    assert all(torch.equal(resumed.state_dict()[k], v) for k, v in trained.items())


def test_a_lora_checkpoint_of_the_earlier_format_still_resumes_exactly(tmp_path, monkeypatch):
    """Earlier checkpoints held the peft model's state under peft's names in model.safetensors."""
    from safetensors.torch import save_file

    def earlier_format(model: torch.nn.Module, weights: dict, directory) -> None:
        save_file(ckpt.distinct_tensors(weights), directory / ckpt.MODEL_FILE)

    monkeypatch.setattr(ckpt, "write_model", earlier_format)
    model = trained_lora_model("bert")
    position = TrainingPosition(global_step=6, steps_in_epoch=6)
    compatibility = ckpt.Compatibility("tiny", 3, 64, type(model).__name__, 16)
    path = ckpt.Checkpoints(RunDirectory(tmp_path), keep=None).save(
        model, position, compatibility, {}, {"optimizer": {}, "rng": []}
    )
    assert not (path / ckpt.LORA_FILE).exists()
    tensors, _, _ = ckpt.load_checkpoint(path)
    resumed = lora.wrap(model_of("bert"), lora.LoraOptions(r=4, alpha=8, dropout=0.0))
    resumed.load_state_dict(ckpt.model_state(tensors, resumed))
    assert all(torch.equal(resumed.state_dict()[k], v) for k, v in model.state_dict().items())
