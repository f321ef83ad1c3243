"""The model families users bring in 2026, each tiny and random-init from transformers' own configuration
classes, saved to a local directory as a downloaded checkpoint would be: encoders (BERT, RoBERTa, XLM-R,
DeBERTa-v2, ModernBERT) and decoder LLM classifiers (Llama, Qwen2, Mistral) whose tokenizers have no pad
token. Each trains with 2 ranks, under Horovod or DDP (ENGINES: each engine gets encoders and decoders), and its
output directory loads in a text-classification pipeline."""

from __future__ import annotations

import json

import pytest
import transformers
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, torchrun, train_here
from support.models import FAMILIES, JOB, model_dir

from horovod_train import synthetic

assert SMALL_JOB[0] == "--model_name_or_path"

JOB += ["--max_steps", "12", "--synthetic_num_examples", "400", "--logging_steps", "4"]

# One engine per family, not both (16 launches were a fifth of the tier's launches): a family is the model and its
# tokenizer, which the trainer builds the same for every engine; an engine's own part is checked on every engine by
# test_engine_equivalence.py. Each engine takes encoders and decoders (DDP's reducer refuses parameters a forward
# leaves unused; a decoder classifies from its last real token, wherever the padding is).
ENGINES = {"bert": "horovod", "roberta": "ddp", "xlm-roberta": "horovod", "deberta-v2": "ddp",
           "modernbert": "ddp", "llama": "horovod", "qwen2": "ddp", "mistral": "horovod"}  # fmt: skip
LAUNCH = {"horovod": horovodrun, "ddp": torchrun}


def test_every_family_has_an_engine() -> None:
    assert ENGINES.keys() == FAMILIES.keys() and set(ENGINES.values()) == set(LAUNCH)
    for kind in ("encoder", "decoder"):  # a decoder's tokenizer pads on a side: (config, sizes, padding side)
        engines = {ENGINES[f] for f, (_, _, side) in FAMILIES.items() if (side is None) == (kind == "encoder")}
        assert engines == set(LAUNCH), kind


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_with_two_ranks_and_loads_in_a_pipeline(tmp_path, cache_dir, family):
    path = model_dir(tmp_path, family)
    engine = ENGINES[family]
    out = tmp_path / f"out-{engine}"
    args = ["--model_name_or_path", str(path), *JOB, "--engine", engine, "--output_dir", str(out)]
    proc = run(LAUNCH[engine](2, *args), cache_dir, timeout=400)
    assert_ok(proc)
    results = read_results(out)
    assert results["engine"] == engine and results["world_size"] == 2, results
    assert len(set(results["param_checksum_per_rank"])) == 1, results
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    pair = {"text": "Ann put the cup next to the box in the hall .", "text_pair": "Ann put the box ."}
    [prediction] = classify([pair])
    assert prediction["label"] in {"entailment", "neutral", "contradiction"}, prediction


def test_a_roberta_trains_at_the_longest_sequence_its_positions_take(tmp_path, cache_dir):
    """RoBERTa's positions count from pad_token_id + 1: this one's 40 position embeddings (pad_token_id 0, its
    WordPiece tokenizer's) take 39 tokens. --max_seq_length 40 on longer texts is capped at 39 with one warning
    line, and it trains (at 40 the position embedding raised IndexError)."""
    path = model_dir(tmp_path, "roberta", max_position_embeddings=40)
    data = tmp_path / "long.jsonl"
    rows = [{**row, "premise": " ".join([row["premise"]] * 3)} for row in synthetic.generate(64, seed=3)]
    data.write_text("".join(json.dumps({k: row[k] for k in ("premise", "hypothesis", "label")}) + "\n" for row in rows))
    out = tmp_path / "out"
    args = ["--engine", "single", "--model_name_or_path", str(path), "--train_file", str(data), "--max_seq_length",
            "40", "--per_device_train_batch_size", "8", "--max_steps", "3", "--disable_tqdm",
            "--output_dir", str(out)]  # fmt: skip
    proc = train_here(cache_dir, *args)
    assert_ok(proc)
    warnings = [line for line in proc.stderr.splitlines() if "--max_seq_length" in line]
    assert warnings == [
        f"warning: --max_seq_length 40 is more than the position embeddings of {path} (40) less the 1 its padding "
        "reserves (39): using --max_seq_length 39"
    ]
    assert read_results(out)["global_step"] == 3
    assert json.loads((out / "run_config.json").read_text())["max_seq_length"] == 39
