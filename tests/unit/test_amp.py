"""Mixed precision and length-grouped batching: bf16 learns on CPU, fp32 stays bit-identical, fp16's
GradScaler order is unscale -> clip -> step -> update, and the grouped sampler shards like DistributedSampler."""

from __future__ import annotations

import collections
import random

import pytest
import torch
from torch.utils.data import DistributedSampler

from horovod_train.cli.main import main
from horovod_train.config.run_config import RunConfig
from horovod_train.data.loaders import LengthGroupedSampler
from horovod_train.engines.single import SingleEngine
from horovod_train.outputs.checkpoint import Checkpoints, Compatibility, load_checkpoint
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.training import amp
from horovod_train.training.position import TrainingPosition


def shards(n: int, world: int, batch: int, epoch: int, grouped: bool = True, seed: int = 7) -> list[list[int]]:
    lengths = [random.Random(i).randint(3, 120) for i in range(n)]
    out = []
    for rank in range(world):
        if grouped:
            sampler = LengthGroupedSampler(range(n), lengths, batch, num_replicas=world, rank=rank, seed=seed)
        else:
            sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=seed)
        sampler.set_epoch(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize(("n", "world", "batch"), [(103, 4, 5), (64, 2, 8), (7, 3, 4), (500, 1, 16)])
def test_grouped_shards_partition_the_padded_dataset_like_distributed_sampler(n, world, batch):
    for epoch in (0, 1):
        grouped, plain = shards(n, world, batch, epoch), shards(n, world, batch, epoch, grouped=False)
        assert [len(s) for s in grouped] == [len(s) for s in plain]  # same per-rank length as DistributedSampler
        # The same multiset: every example once, plus DistributedSampler's padding repeats.
        assert collections.Counter(i for s in grouped for i in s) == collections.Counter(i for s in plain for i in s)
        assert set(i for s in grouped for i in s) == set(range(n))


def test_grouped_order_is_deterministic_per_epoch_and_changes_between_epochs():
    assert shards(200, 2, 8, epoch=3) == shards(200, 2, 8, epoch=3)
    assert shards(200, 2, 8, epoch=3) != shards(200, 2, 8, epoch=4)
    assert shards(200, 2, 8, epoch=3, seed=1) != shards(200, 2, 8, epoch=3, seed=2)


def test_grouped_batches_need_less_padding():
    n, world, batch = 800, 2, 16
    lengths = [random.Random(i).randint(3, 120) for i in range(n)]

    def padding(per_rank: list[list[int]]) -> int:
        chunks = [s[k : k + batch] for s in per_rank for k in range(0, len(s), batch)]
        return sum(max(lengths[i] for i in c) * len(c) - sum(lengths[i] for i in c) for c in chunks)

    assert padding(shards(n, world, batch, 0)) < 0.3 * padding(shards(n, world, batch, 0, grouped=False))


def test_grouped_sampler_resumes_inside_an_epoch():
    lengths = [random.Random(i).randint(3, 120) for i in range(90)]
    sampler = LengthGroupedSampler(range(90), lengths, 4, num_replicas=2, rank=1, seed=0)
    sampler.begin_epoch(2, 0)
    full = list(sampler)
    sampler.begin_epoch(2, 24)  # 24 examples over both ranks: 12 of this rank's shard
    assert list(sampler) == full[12:] and len(sampler) == len(full) - 12


def tiny_model_and_batch(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    return model, x, y


def test_fp32_precision_is_a_no_op_and_steps_bit_identically():
    precision = amp.Precision("fp32", torch.device("cpu"))
    assert precision.scaler is None and precision.state_dict() == {}
    engine = SingleEngine(RunConfig())
    models = []
    for use_engine in (False, True):
        model, x, y = tiny_model_and_batch()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            if use_engine:  # the trainer's path
                with precision.autocast():
                    assert not torch.is_autocast_enabled("cpu")
                    loss = torch.nn.functional.cross_entropy(model(x), y)
                precision.backward(loss)
                engine.clip_and_step(model, optimizer, 0.5, precision.scaler)
            else:  # the code before mixed precision existed
                torch.nn.functional.cross_entropy(model(x), y).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
            optimizer.zero_grad()
        models.append(model)
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_bf16_autocast_on_cpu():
    precision = amp.Precision("bf16", torch.device("cpu"))
    model, x, _ = tiny_model_and_batch()
    with precision.autocast():
        assert model(x).dtype == torch.bfloat16
    assert precision.scaler is None


def test_grad_scaler_unscales_before_clipping_then_steps_and_updates():
    """Engine.clip_and_step with a scaler equals: scale the loss, unscale, clip the true gradient, step."""
    engine = SingleEngine(RunConfig())
    results = []
    for scaled in (False, True):
        model, x, y = tiny_model_and_batch()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if scaled else None
        loss = torch.nn.functional.cross_entropy(model(x), y)
        (scaler.scale(loss) if scaler else loss).backward()
        engine.clip_and_step(model, optimizer, 0.05, scaler)
        results.append([p.detach().clone() for p in model.parameters()])
        if scaler:
            assert scaler.get_scale() == 1024.0  # no inf: the scale is kept (grows only after 2000 steps)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_scaler_state_is_saved_in_checkpoints(tmp_path):
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0)
    model, _, _ = tiny_model_and_batch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    position = TrainingPosition(global_step=1, steps_in_epoch=1)
    compatibility = Compatibility("tiny", 3, 10, "Linear", 32)
    state = {"optimizer": optimizer.state_dict(), amp.SCALER_KEY: scaler.state_dict()}
    path = Checkpoints(RunDirectory(tmp_path), keep=1).save(model, position, compatibility, {}, state)
    training_state = load_checkpoint(path)[1]  # weights_only=True
    assert training_state[amp.SCALER_KEY]["scale"] == 512.0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fp16"], "--fp16 needs a CUDA GPU"),
        (["--bf16", "--fp16"], "--bf16 and --fp16 are both set"),
        (["--autotune_log", "tune.csv"], "--autotune_log without --autotune"),
    ],
)
def test_bad_precision_input_is_one_line(args, message, tmp_path, capsys):
    if args == ["--fp16"] and torch.cuda.is_available():
        pytest.skip("fp16 is allowed with CUDA")
    out = tmp_path / "never"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "single", *args, "--output_dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not out.exists()
