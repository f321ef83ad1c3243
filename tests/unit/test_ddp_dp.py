"""The DDP and DataParallel engines on their own: uneven shards, launch mistakes, bad input."""

from __future__ import annotations

import threading

import pytest
import torch

from horovod_train.cli.main import main


def test_ddp_bucket_cap_must_be_positive(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "ddp", "--ddp_bucket_cap_mb", "0", "--output_dir", str(out)])
    assert exit_info.value.code == 2
    assert "--ddp_bucket_cap_mb must be > 0" in capsys.readouterr().err
    assert not out.exists()


def test_dp_weights_unequal_replica_shares_by_example_count():
    """What DataParallel does with 5 examples on 2 GPUs (a 3/2 split), done by hand on the CPU: the
    engine's loss over the per-replica (loss, count) pairs equals the loss of the whole batch."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from horovod_train.config.run_config import RunConfig, TrainingArguments
    from horovod_train.engines.dp import DataParallelEngine, LossPerReplica

    torch.manual_seed(0)
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    config.update({"intermediate_size": 32, "num_labels": 3, "hidden_dropout_prob": 0.0, "initializer_range": 1.0})
    model = BertForSequenceClassification(config).eval()
    batch = {"input_ids": torch.randint(5, 50, (5, 7)), "labels": torch.tensor([0, 1, 2, 2, 1])}
    replica = LossPerReplica(model)
    shares = [replica(**{k: v[s] for k, v in batch.items()}) for s in (slice(0, 3), slice(3, 5))]
    gathered = tuple(torch.cat(parts) for parts in zip(*shares, strict=True))
    engine = DataParallelEngine(RunConfig(training=TrainingArguments(engine="dp")))
    loss = engine.forward_loss(lambda **_: gathered, batch)
    assert gathered[1].tolist() == [3.0, 2.0]
    assert loss.item() == pytest.approx(model(**batch).loss.item(), abs=1e-6)
    assert abs(loss.item() - gathered[0].mean().item()) > 1e-3  # the plain mean would be wrong


class RecordsAutocast(torch.nn.Module):
    """A classifier stand-in that records the autocast state of the thread it runs in."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.seen: list[tuple[bool, object, object]] = []

    def forward(self, input_ids, labels):
        logits = self.linear(input_ids.float())
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"), logits.dtype))
        return type("Output", (), {"loss": torch.nn.functional.cross_entropy(logits.float(), labels)})()


@pytest.mark.parametrize("run_dtype", ["float16", "bfloat16"])
def test_dp_replicas_autocast_to_the_runs_dtype_in_their_own_threads(run_dtype):
    """DataParallel's parallel_apply runs each replica in a new thread and re-enters autocast there with
    enabled=... and no dtype; autocast's dtype is per thread, so the thread gets the device's default
    (float16 on CUDA), not the run's --bf16. The same mechanism on the CPU, where the default is bfloat16:
    the replica must compute in the run's dtype whichever it is."""
    from horovod_train.engines.dp import LossPerReplica

    dtype = getattr(torch, run_dtype)
    model = RecordsAutocast()
    replica = LossPerReplica(model, dtype)
    batch = {"input_ids": torch.ones(2, 4), "labels": torch.tensor([0, 1])}

    def parallel_apply_thread() -> None:
        with torch.autocast("cpu", enabled=True):  # what parallel_apply does, for its device type
            replica(**batch)

    with torch.autocast("cpu", dtype=dtype):  # the trainer's autocast, in the main thread
        worker = threading.Thread(target=parallel_apply_thread)
        worker.start()
        worker.join()
    assert model.seen == [(True, dtype, dtype)]


def test_dp_engine_passes_the_runs_autocast_dtype_to_its_replicas():
    from horovod_train.config.run_config import RunConfig, TrainingArguments
    from horovod_train.engines.dp import DataParallelEngine

    for flags, dtype in (({}, None), ({"bf16": True}, torch.bfloat16), ({"fp16": True}, torch.float16)):
        engine = DataParallelEngine(RunConfig(training=TrainingArguments(engine="dp", **flags)))
        wrapped, _ = engine.wrap(torch.nn.Linear(2, 2), None)
        assert wrapped.module.autocast_dtype == dtype


def test_dp_refuses_torch_compile_before_writing_anything(tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--engine", "dp", "--torch_compile", "--output_dir", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "error: --engine dp cannot use --torch_compile" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("requested", "cuda", "backend"),
    [("auto", True, "nccl"), ("auto", False, "gloo"), ("gloo", True, "gloo"), ("gloo", False, "gloo"),
     ("nccl", True, "nccl")],
)  # fmt: skip
def test_ddp_backend_is_chosen_apart_from_the_device(requested, cuda, backend):
    """--ddp_backend picks the process group only: the model goes to the rank's GPU whenever CUDA is there, so
    `--ddp_backend gloo` on a GPU node trains CUDA tensors through Gloo (two ranks may share one GPU), where it
    used to leave the model on the CPU; on CPUs nothing changes."""
    from horovod_train.engines.ddp_options import DDPArguments

    assert DDPArguments(ddp_backend=requested).backend_on(cuda) == backend


def test_ddp_backend_nccl_without_cuda_is_one_error():
    from horovod_train.common.errors import UsageError
    from horovod_train.engines.ddp_options import DDPArguments

    with pytest.raises(UsageError, match="--ddp_backend nccl needs CUDA GPUs"):
        DDPArguments(ddp_backend="nccl").backend_on(False)
