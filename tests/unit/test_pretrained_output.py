"""The final output of a model no rank holds whole (engines/pretrained.py), in one process: FSDP2 over a world of
one, the model written a tensor at a time in save_pretrained's layout, split at --max_shard_size. Two ranks: the
compared fsdp run of tests/integration/test_engine_equivalence.py (the same flag)."""

from __future__ import annotations

import json
import weakref

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from transformers import AutoModelForSequenceClassification, LlamaConfig

from horovod_train.engines import pretrained
from horovod_train.engines.parallelize import transformer_blocks

CONFIG = LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                     num_key_value_heads=4, intermediate_size=172, num_labels=3, pad_token_id=0)  # fmt: skip


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_sharded_model_is_written_split_one_whole_tensor_at_a_time(one_rank, tmp_path, monkeypatch):
    """Files of at most 200 KB (the 256 KB embedding alone in its own, as save_pretrained puts a larger tensor)
    with transformers' index; from_pretrained loads the model as it was; no two whole tensors ever exist at once."""
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(CONFIG)
    expected = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (1,))
    for module in [*transformer_blocks(model), model]:
        fully_shard(module, mesh=mesh)
    shards = model.state_dict()
    assert all(isinstance(t, DTensor) for t in shards.values())

    alive: list[weakref.ref] = []
    most = []
    gather = pretrained.whole

    def counted(tensor: torch.Tensor) -> torch.Tensor:
        full = gather(tensor)
        alive[:] = [ref for ref in alive if ref() is not None]
        alive.append(weakref.ref(full))
        most.append(len(alive))
        return full

    monkeypatch.setattr(pretrained, "whole", counted)
    out = tmp_path / "out"
    out.mkdir()
    files = pretrained.write_from_shards(model, shards, out, "200KB", True, lambda obj: [obj])
    assert max(most) == 1 and len(most) == len(expected), most

    index = json.loads((out / pretrained.INDEX_FILE).read_text())
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == sorted(files)
    assert index["metadata"]["total_parameters"] == sum(t.numel() for t in expected.values())
    for name in files:  # at most the size, or one tensor larger than it
        sizes = [tensor.nbytes for tensor in load_file(out / name).values()]
        assert sum(sizes) <= 200_000 or len(sizes) == 1, (name, sizes)
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForSequenceClassification"]
    loaded = AutoModelForSequenceClassification.from_pretrained(out).state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[name], tensor) for name, tensor in expected.items())


def test_one_file_without_an_index_where_the_model_fits(one_rank, tmp_path):
    model = AutoModelForSequenceClassification.from_config(CONFIG)
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    files = pretrained.write_from_shards(model, model.state_dict(), tmp_path, "50GB", True, lambda obj: [obj])
    assert files == ["model.safetensors"] and not (tmp_path / pretrained.INDEX_FILE).exists()
