"""The model families users bring in 2026, each tiny and random-init from transformers' own configuration
classes, saved to a local directory as a downloaded checkpoint would be: encoders (BERT, RoBERTa, XLM-R,
DeBERTa-v2, ModernBERT) and decoder LLM classifiers (Llama, Qwen2, Mistral) whose tokenizers have no pad
token. Each trains under Horovod and DDP (np=2) and its output directory loads in a text-classification
pipeline."""

from __future__ import annotations

import pytest
import transformers
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, torchrun
from support.models import FAMILIES, JOB, model_dir

assert SMALL_JOB[0] == "--model_name_or_path"

JOB += ["--max_steps", "12", "--synthetic_num_examples", "400", "--logging_steps", "4"]


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_under_horovod_and_ddp_and_loads_in_a_pipeline(tmp_path, cache_dir, family):
    path = model_dir(tmp_path, family)
    for engine, launch in (("horovod", horovodrun), ("ddp", torchrun)):
        out = tmp_path / f"out-{engine}"
        args = ["--model_name_or_path", str(path), *JOB, "--output_dir", str(out)]
        if engine == "ddp":
            args += ["--engine", "ddp"]
        proc = run(launch(2, *args), cache_dir, timeout=400)
        assert_ok(proc)
        results = read_results(out)
        assert results["world_size"] == 2 and len(set(results["param_checksum_per_rank"])) == 1, results
        classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
        pair = {"text": "Ann put the cup next to the box in the hall .", "text_pair": "Ann put the box ."}
        [prediction] = classify([pair])
        assert prediction["label"] in {"entailment", "neutral", "contradiction"}, prediction
