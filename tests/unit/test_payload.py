"""The resume payload's unpickler takes only what a checkpoint holds: a payload whose unpickling would run code is
refused on the receiving ranks (it used to run), and a checkpoint's real content still arrives whole."""

from __future__ import annotations

import io
import pickle
import subprocess

import pytest
import torch
from support.checks import threads_broadcast

from horovod_train.engines.payload import CHUNK_BYTES, _SkeletonUnpickler
from horovod_train.training import rng


class RunsCode:
    """Unpickling this runs a command (what an unrestricted unpickler does with such bytes)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return subprocess.call, (["touch", self.marker],)


def test_a_payload_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(pickle.UnpicklingError, match="subprocess.call, which no checkpoint holds"):
        threads_broadcast([{"state": RunsCode(str(marker))}, None], CHUNK_BYTES)
    assert not marker.exists()


def test_a_malformed_tensor_placeholder_is_refused():
    class Forged(pickle.Pickler):
        def persistent_id(self, obj):
            return ("os", "system") if isinstance(obj, torch.Tensor) else None

    file = io.BytesIO()
    Forged(file).dump({"w": torch.ones(1)})
    with pytest.raises(pickle.UnpicklingError, match="malformed tensor placeholder"):
        _SkeletonUnpickler(io.BytesIO(file.getvalue())).load()


def test_what_a_checkpoint_holds_arrives_whole():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(4, 3)).sum().backward()
    optimizer.step()
    sent = ({k: v.clone() for k, v in model.state_dict().items()},
            {"optimizer": optimizer.state_dict(), "rng": [rng.capture()], "dtype": torch.bfloat16,
             "size": torch.Size([2, 3]), "labels": {"a", "b"}},
            {"global_step": 3, "log_history": [{"loss": 1.5}]})  # fmt: skip
    _, received = threads_broadcast([sent, None], CHUNK_BYTES)
    tensors, state, trainer_state = received
    assert all(torch.equal(tensors[k], v) for k, v in sent[0].items()) and trainer_state == sent[2]
    assert state["rng"] == sent[1]["rng"] and state["dtype"] is torch.bfloat16 and state["labels"] == {"a", "b"}
    assert state["optimizer"]["param_groups"] == sent[1]["optimizer"]["param_groups"]
