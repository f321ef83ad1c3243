"""Exact resume from any step, in this process: single-rank draws (hypothesis) of a whole run stopped
and resumed, and world size 2 at the sampler level (every rank's sampler built here). The real two-rank
runs under horovodrun are in tests/integration/test_resume_property.py."""

from __future__ import annotations

from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from horovod_train.data.loaders import ResumableDistributedSampler, train_loader
from horovod_train.training.position import TrainingPosition


def rank_steps(sampler: ResumableDistributedSampler, batch: int, accumulation: int) -> list[list[int]]:
    """A rank's examples per optimizer step, read through a DataLoader as the trainer reads them (a last
    partial batch as it is; micro-batches that make no full step are left over)."""
    loader = DataLoader(range(10**6), batch_size=batch, sampler=sampler)
    batches = [b.tolist() for b in loader]
    steps = len(batches) // accumulation
    return [sum(batches[s * accumulation : (s + 1) * accumulation], []) for s in range(steps)]


def samplers(n: int, lengths: list[int] | None, batch: int, accumulation: int, world: int, epoch: int,
             samples_in_epoch: int = 0) -> list[ResumableDistributedSampler]:  # fmt: skip
    """Every rank's training sampler, as train_loader builds it (``lengths``: --group_by_length)."""
    dataset = Dataset.from_dict({"input_ids": [[0] * length for length in lengths or [1] * n]})
    built = []
    for rank in range(world):
        loader = train_loader(dataset, None, batch, world, rank, seed=3, group_by_length=lengths is not None,
                              gradient_accumulation_steps=accumulation)  # fmt: skip
        loader.sampler.begin_epoch(epoch, samples_in_epoch)
        built.append(loader.sampler)
    return built


def global_steps(n, lengths, batch, accumulation, world, epoch, samples_in_epoch=0) -> list[list[int]]:
    """Each optimizer step's examples over all ranks, as a sorted list."""
    per_rank = [rank_steps(s, batch, accumulation) for s in samplers(n, lengths, batch, accumulation, world, epoch,
                                                                      samples_in_epoch)]  # fmt: skip
    assert len({len(steps) for steps in per_rank}) == 1, "every rank takes the same number of steps"
    return [sorted(sum(step, [])) for step in zip(*per_rank, strict=True)]


@given(
    n=st.integers(1, 300),
    batch=st.integers(1, 12),
    accumulation=st.integers(1, 3),
    world=st.sampled_from([1, 2, 4]),
    grouped=st.booleans(),
    epoch=st.integers(0, 3),
    data=st.data(),
)
@settings(max_examples=150, deadline=None, derandomize=True, database=None, print_blob=False)
def test_every_rank_resumes_its_shard_after_any_step(n, batch, accumulation, world, grouped, epoch, data):
    """Stopped after any step of an epoch (its last, with a partial batch, included), every rank's resumed
    sampler yields exactly what its shard had left, counted as the trainer counts what a step consumed."""
    lengths = [(i * 7919) % 97 + 1 for i in range(n)] if grouped else None
    full = samplers(n, lengths, batch, accumulation, world, epoch)
    shards = [list(s) for s in full]
    steps = [rank_steps(s, batch, accumulation) for s in full]
    if not steps[0]:
        return  # fewer micro-batches than one step takes: refused by the trainer
    stop = data.draw(st.integers(1, len(steps[0])), label="stopped after step")
    position = TrainingPosition(epoch=epoch)
    for step in range(stop):
        position.advance(len(steps[0][step]) * world)  # the trainer counts its rank's examples x ranks
    for rank, sampler in enumerate(samplers(n, lengths, batch, accumulation, world, epoch,
                                            position.samples_in_epoch)):  # fmt: skip
        consumed = sum(len(s) for s in steps[rank][:stop])
        assert list(sampler) == shards[rank][consumed:]
        assert len(sampler) == len(shards[rank]) - consumed


@given(
    n=st.integers(1, 400),
    per_device=st.sampled_from([1, 2, 4, 8, 16]),
    splits=st.sampled_from([((2, 2), (4, 1)), ((1, 4), (2, 2)), ((1, 2), (2, 1)), ((1, 4), (4, 1))]),
    grouped=st.booleans(),
    epoch=st.integers(0, 2),
)
@settings(max_examples=60, deadline=None, derandomize=True, database=None, print_blob=False)
def test_a_global_batch_trains_the_same_examples_however_it_is_split(n, per_device, splits, grouped, epoch):
    """ranks x accumulation splits of one global batch: each optimizer step takes the same examples (the
    padding of the last step, fewer than the world size, aside), so a checkpoint of one split resumes
    exactly under another (the compatibility check compares only the global batch)."""
    lengths = [(i * 104729) % 61 + 1 for i in range(n)] if grouped else None
    (world_a, accum_a), (world_b, accum_b) = splits
    a = global_steps(n, lengths, per_device, accum_a, world_a, epoch)
    b = global_steps(n, lengths, per_device, accum_b, world_b, epoch)
    whole = min(len(a), len(b), n // (per_device * accum_a * world_a))  # steps that hold no padding
    assert a[:whole] == b[:whole]
