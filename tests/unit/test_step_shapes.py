"""A step with few shapes (issue 59): batches padded to a handful of bucket lengths, so that a compiled step
compiles once per bucket; padding-free batches for decoders, equal to padded ones."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import transformers
from support.host_syncs import offline_cache  # noqa: F401 (a fixture)
from support.jobs import SMALL_JOB
from support.models import model_dir, texts
from transformers import DataCollatorWithPadding

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.data.loaders import BatchWidths, FlattenedBatches, WidenedBatches
from horovod_train.engines.single import SingleEngine
from horovod_train.models.model import enable_padding_free
from horovod_train.training.build import set_attention
from horovod_train.training.trainer import Trainer


def test_buckets_are_quantiles_of_the_lengths_rounded_up_and_the_last_holds_the_longest():
    lengths = [5] * 25 + [13] * 25 + [30] * 24 + [61]
    widths = BatchWidths.of(lengths, 4, 8)
    assert widths.buckets == (8, 16, 32, 64)
    assert BatchWidths.of([5] * 60 + [30] * 40, 4, 8).buckets == (8, 32)  # equal quantiles make one bucket
    # Batches of 4 drawn at random: the median of their longest is the examples' 0.5 ** (1/4) = 0.84-quantile.
    assert BatchWidths.of(range(1, 101), 2, 1, batch=4).buckets == (85, 100)
    assert [widths.width(n) for n in (1, 8, 9, 30, 61)] == [8, 8, 16, 32, 64]
    assert BatchWidths.of(lengths, 0, 8).width(13) == 16  # --pad_to_multiple_of alone
    assert BatchWidths.of(lengths, 0, None) is None


@pytest.mark.parametrize("side", ["right", "left"])
def test_a_batch_is_padded_to_its_bucket_on_the_tokenizers_side(tmp_path, side):
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir(tmp_path, "bert"))
    tokenizer.padding_side = side
    collate = WidenedBatches(DataCollatorWithPadding(tokenizer), BatchWidths(8, (6, 12)), 0, side)
    features = [{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1], "labels": 1},
                {"input_ids": [5, 6, 7, 8, 9, 10, 11], "attention_mask": [1] * 7, "labels": 0}]  # fmt: skip
    batch = collate(features)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == (2, 12)
    assert batch["attention_mask"].sum(1).tolist() == [3, 7]
    real = batch["input_ids"][1][batch["attention_mask"][1].bool()].tolist()
    assert real == [5, 6, 7, 8, 9, 10, 11]
    assert batch["attention_mask"][1, -1 if side == "right" else 0] == 0


def padded_and_flat(tokenizer, n: int = 6) -> tuple[dict, dict]:
    features = [{"input_ids": tokenizer(t)["input_ids"], "labels": i % 3} for i, t in enumerate(texts(n)[:n])]
    padded = DataCollatorWithPadding(tokenizer)([{**f, "attention_mask": [1] * len(f["input_ids"])} for f in features])
    return padded, FlattenedBatches(DataCollatorWithPadding(tokenizer))(features)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # Llama pads on the right, Qwen on the left
def test_a_padding_free_batch_trains_as_the_padded_one_on_decoders(tmp_path, family):
    path = model_dir(tmp_path, family)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    tokenizer.pad_token = tokenizer.eos_token  # as model.load_tokenizer does for a decoder without one
    model = transformers.AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    enable_padding_free(model)
    padded, flat = padded_and_flat(tokenizer)
    assert flat["input_ids"].shape == (1, int(padded["attention_mask"].sum())) and padded["input_ids"].shape[1] > 5
    outputs, grads = [], []
    for batch in (padded, flat):
        model.zero_grad()
        out = model(**batch)
        out.loss.backward()
        outputs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(outputs[1].logits, outputs[0].logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[1].loss, outputs[0].loss, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-4)


def test_padding_free_is_refused_for_an_encoder(tmp_path):
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir(tmp_path, "bert"))
    with pytest.raises(UsageError, match="--padding_free needs a decoder model"):
        enable_padding_free(model)


def varied_lengths(path: Path, n: int = 600, longest: int = 24) -> Path:
    """Sentences of 1 to ``longest`` words (synthetic-nli's batches all pad to about one length)."""
    words = " ".join(texts(200)).split()
    generator = random.Random(3)
    rows = [(" ".join(generator.choices(words, k=generator.randint(1, longest))), i % 3) for i in range(n)]
    path.write_text("sentence,label\n" + "".join(f'"{text}",{label}\n' for text, label in rows))
    return path


def trained_graphs(tmp_path, *flags: str, steps: int = 12) -> tuple[int, int, set[int]]:
    """(graphs compiled in the first ``steps`` steps, in the ``steps`` after, the batch widths seen)."""
    from torch._dynamo.utils import counters

    data = varied_lengths(tmp_path / "train.csv")
    run_config = parse_run_config([*SMALL_JOB, "--engine", "single", "--train_file", str(data),
                                   "--torch_compile_backend", "eager", "--max_steps", "100",
                                   "--output_dir", str(tmp_path / "run"), *flags])  # fmt: skip
    torch._dynamo.reset()
    counters.clear()
    engine = SingleEngine(run_config)
    widths: set[int] = set()
    with engine.running():
        loop = Trainer(run_config, engine).setup()
        loop.enter(loop.position)
        batches = iter(loop.parts.train_loader)

        def seen():
            for batch in batches:
                widths.add(batch["input_ids"].shape[1])
                yield batch

        stream = seen()
        for _ in range(steps):
            loop.train_step(stream, loop.position)
        first = counters["stats"]["unique_graphs"]
        for _ in range(steps):
            loop.train_step(stream, loop.position)
        return first, counters["stats"]["unique_graphs"] - first, widths


def test_a_compiled_step_compiles_once_per_bucket_and_not_again(tmp_path, offline_cache):  # noqa: F811
    flags = ("--length_buckets", "3", "--pad_to_multiple_of", "8", "--group_by_length")
    first, later, widths = trained_graphs(tmp_path, *flags)
    assert len(widths) == 3 and all(w % 8 == 0 for w in widths)  # without buckets: a length per batch
    assert first > 0 and later == 0  # every bucket's graph compiled in the first steps; none since


def test_attn_implementation_chooses_the_models_attention_and_one_the_machine_lacks_is_refused(
    tmp_path,
    offline_cache,  # noqa: F811
):
    run_config = parse_run_config([*SMALL_JOB, "--engine", "single", "--attn_implementation", "eager",
                                   "--output_dir", str(tmp_path / "run")])  # fmt: skip
    engine = SingleEngine(run_config)
    with engine.running():
        loop = Trainer(run_config, engine).setup()
    assert engine.unwrap(loop.parts.model).config._attn_implementation == "eager"  # transformers' default: sdpa
    model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir(tmp_path, "llama"))
    with pytest.raises(UsageError) as refused:
        set_attention(model, "flash_attention_2")  # flash-attn is not installed here (nor is it on a CPU)
    assert str(refused.value).startswith("--attn_implementation flash_attention_2: ")
    assert str(refused.value).count("\n") == 0


def test_padding_free_with_bucket_padding_is_refused_in_one_line():
    with pytest.raises(UsageError) as refused:
        parse_run_config(["--padding_free", "--length_buckets", "4"])
    assert str(refused.value) == (
        "--padding_free batches have no padding to shape, so --length_buckets would do nothing; "
        "fix: drop --padding_free or --length_buckets"
    )


def test_evaluation_batches_take_the_training_buckets_so_a_compiled_model_compiles_once_per_bucket(
    tmp_path,
    offline_cache,  # noqa: F811
):
    """A validation set with longer sentences than training's, in batches of 2 (many lengths): its batches are
    padded to the training's buckets and one more for its longest, so evaluation compiles at most a graph per
    bucket, and nothing the second time (without them: a graph per length, until dynamo's limit and eager)."""
    from torch._dynamo.utils import counters

    train, validation = varied_lengths(tmp_path / "train.csv"), varied_lengths(tmp_path / "val.csv", 64, longest=40)
    flags = ["--length_buckets", "3", "--pad_to_multiple_of", "8", "--group_by_length"]
    flags += ["--torch_compile_backend", "eager"]
    run_config = parse_run_config([*SMALL_JOB, "--engine", "single", "--train_file", str(train), *flags,
                                   "--validation_file", str(validation), "--per_device_eval_batch_size", "2",
                                   "--output_dir", str(tmp_path / "run")])  # fmt: skip
    torch._dynamo.reset()
    counters.clear()
    engine = SingleEngine(run_config)
    with engine.running():
        loop = Trainer(run_config, engine).setup()
        buckets = loop.parts.widths.buckets
        first = loop.evaluator.evaluate_all()
        graphs = counters["stats"]["unique_graphs"]
        again = loop.evaluator.evaluate_all()
    assert len(buckets) == 3 and 0 < graphs <= len(buckets) + 1, (buckets, graphs)
    assert counters["stats"]["unique_graphs"] == graphs and again["eval_accuracy"] == first["eval_accuracy"]
    assert first["eval_samples"] == 64


def test_a_split_longer_than_the_buckets_gets_one_bucket_more():
    widths = BatchWidths(8, (16, 32))
    assert widths.covering(30) is widths and BatchWidths(8).covering(70) == BatchWidths(8)
    assert widths.covering(45) == BatchWidths(8, (16, 32, 48)) and widths.covering(45).width(40) == 48
