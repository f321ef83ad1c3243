"""Same training, provably: every engine under its real launcher ends with the same parameters.

W=2 ranks of per-rank batch b (Horovod with the Gloo and the MPI controller, DDP under torchrun and
mpirun) against one process with 2b (single, DataParallel), with and without gradient accumulation;
see docs/equivalence.md. The sampler test checks the data side exactly (index sets per global batch).
"""

from __future__ import annotations

import pytest

from horovod_train.data.loaders import train_loader
from horovod_train.models.model import load_tokenizer, prepare_tiny_tokenizer, tiny_tokenizer_dir


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """100 examples whose label is their index, so a batch's labels name its examples."""
    from datasets import Dataset

    texts = [f"example {i} moves the lamp" for i in range(100)]
    directory = tiny_tokenizer_dir(tmp_path_factory.mktemp("tok"), texts)
    prepare_tiny_tokenizer(directory, texts)
    tokenizer = load_tokenizer(str(directory))
    rows = [{**tokenizer(t, t[::-1]), "labels": i} for i, t in enumerate(texts)]
    return Dataset.from_list(rows), tokenizer


def batches(dataset, tokenizer, batch: int, world: int, rank: int, epoch: int) -> list[set[int]]:
    loader = train_loader(dataset, tokenizer, batch, world, rank, seed=42)
    loader.sampler.set_epoch(epoch)
    return [set(b["labels"].tolist()) for b in loader]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("micro_steps", [1, 2])
def test_global_batch_is_the_single_process_batch(tokenized, world, micro_steps):
    """Step k's union over ranks (and micro-steps) of per-rank batches of b is the single-process batch k
    of world x micro_steps x b, for every step the trainer takes in each of 3 epochs."""
    dataset, tokenizer = tokenized
    b = 2
    for epoch in range(3):
        single = batches(dataset, tokenizer, world * micro_steps * b, 1, 0, epoch)
        per_rank = [batches(dataset, tokenizer, b, world, r, epoch) for r in range(world)]
        assert all(len(p) == len(per_rank[0]) for p in per_rank)
        steps = len(per_rank[0]) // micro_steps  # the trainer drops an incomplete accumulation
        assert 6 <= steps <= len(single)
        for k in range(steps):
            micro = range(k * micro_steps, (k + 1) * micro_steps)
            union = set().union(*(per_rank[r][m] for r in range(world) for m in micro))
            assert union == single[k], f"epoch {epoch} step {k}"
        assert single[0] != batches(dataset, tokenizer, world * micro_steps * b, 1, 0, epoch + 1)[0]
