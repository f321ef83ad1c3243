"""The model families users bring in 2026, each tiny and random-init from transformers' own configuration
classes, saved to a local directory as a downloaded checkpoint would be: encoders (BERT, RoBERTa, XLM-R,
DeBERTa-v2, ModernBERT) and decoder LLM classifiers (Llama, Qwen2, Mistral) whose tokenizers have no pad
token. Every family trains in one process and its output directory loads in a text-classification pipeline; with 2
ranks, each engine (Horovod, DDP) trains an encoder and a decoder every run, drawn from pytest-randomly's seed, so
that every family meets every engine over the runs."""

from __future__ import annotations

import json
import random

import pytest
import transformers
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run, torchrun, train_here
from support.models import FAMILIES, JOB, model_dir

from horovod_train.data import synthetic

assert SMALL_JOB[0] == "--model_name_or_path"

JOB += ["--max_steps", "12", "--synthetic_num_examples", "400", "--logging_steps", "4"]

# A family is the model and its tokenizer, which the trainer builds the same for every engine (an engine's own part
# is checked on every engine by test_engine_equivalence.py): one process shows that a family trains and loads. What
# two ranks add depends on the engine and the kind: DDP's reducer refuses parameters a forward leaves unused, and a
# decoder classifies from its last real token, wherever the padding is. So each engine takes one encoder and one
# decoder a run (4 launches; all 8 families under both engines were 16, one engine each 8).
LAUNCH = {"horovod": horovodrun, "ddp": torchrun}
KINDS = {
    "encoder": [family for family, (_, _, side) in FAMILIES.items() if side is None],
    "decoder": [family for family, (_, _, side) in FAMILIES.items() if side is not None],
}
PAIR = {"text": "Ann put the cup next to the box in the hall .", "text_pair": "Ann put the box ."}


def run_seed(config: pytest.Config) -> int:
    """pytest-randomly's seed of this run (`--randomly-seed=N` repeats a run's draw); 0 without it."""
    seed = getattr(config.option, "randomly_seed", None)
    return seed if isinstance(seed, int) else 0


def drawn(seed: int, kind: str) -> dict[str, str]:
    """engine -> the family of ``kind`` it trains with two ranks in the run of ``seed``: two different ones."""
    families = random.Random(f"{seed}-{kind}").sample(KINDS[kind], len(LAUNCH))
    return dict(zip(LAUNCH, families, strict=True))


def assert_loads_in_a_pipeline(out) -> None:
    classify = transformers.pipeline("text-classification", model=str(out), device="cpu")
    [prediction] = classify([PAIR])
    assert prediction["label"] in {"entailment", "neutral", "contradiction"}, prediction


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_trains_in_one_process_and_loads_in_a_pipeline(tmp_path, cache_dir, family):
    out = tmp_path / "out"
    args = ["--model_name_or_path", str(model_dir(tmp_path, family)), *JOB, "--engine", "single"]
    assert_ok(train_here(cache_dir, *args, "--output_dir", str(out)))
    assert read_results(out)["global_step"] == 12
    assert_loads_in_a_pipeline(out)


def test_every_family_meets_every_engine_over_the_runs() -> None:
    assert sorted([*KINDS["encoder"], *KINDS["decoder"]]) == sorted(FAMILIES)
    met = {(engine, family) for seed in range(40) for kind in KINDS for engine, family in drawn(seed, kind).items()}
    assert met == {(engine, family) for engine in LAUNCH for family in FAMILIES}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("engine", list(LAUNCH))
def test_a_drawn_family_trains_with_two_ranks_and_loads_in_a_pipeline(request, tmp_path, cache_dir, engine, kind):
    family = drawn(run_seed(request.config), kind)[engine]
    print(f"{engine} {kind}: {family}")
    out = tmp_path / f"out-{engine}"
    args = ["--model_name_or_path", str(model_dir(tmp_path, family)), *JOB, "--engine", engine]
    proc = run(LAUNCH[engine](2, *args, "--output_dir", str(out)), cache_dir, timeout=400)
    assert_ok(proc)
    results = read_results(out)
    assert results["engine"] == engine and results["world_size"] == 2, (family, results)
    assert len(set(results["param_checksum_per_rank"])) == 1, (family, results)
    assert_loads_in_a_pipeline(out)


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
