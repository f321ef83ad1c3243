"""FSDP2: the model's parameters, gradients and AdamW's state sharded over the ranks (torch's ``fully_shard``).

Each transformer block (found from the model: the largest list of identical modules) is one FSDP unit, then the
root takes the rest (embeddings, head). A block's parameters are all-gathered before its forward and again before
its backward, and its gradients reduce-scattered after; ``--fsdp_reshard_after_forward true`` frees the gathered
parameters between the two (ZeRO-3), ``false`` keeps them from forward to backward (ZeRO-2: more memory, one
all-gather less per block). Per parameter a rank holds 16/S bytes of state (fp32 weights, gradient, AdamW's two
moments; S the ranks of its shard group: memory.FullySharded) plus one block gathered at a time.

HSDP (``--fsdp_replicate_degree R``): the world is R replicas of S = W/R shards (a 2-D mesh, mesh.py); a block is
gathered within the shard group, its gradient reduce-scattered there and the shards all-reduced across replicas.
By default one replica per node where the job spans several nodes of 2+ ranks each (mesh.per_node), else plain
FSDP over the world.

The launchers, process group and collectives are those of process_group.py (NCCL on GPUs, Gloo on CPUs), the
sharding parallelize.FullyShard. Ranks other than 0 build the model on the meta device; once sharded, every rank's
shards are filled from rank 0's model, so no rank but 0 ever holds the whole model. A checkpoint is written by every
rank at once, nobody gathering (checkpoint_io.Shards): each rank writes its shards' rows into the whole model's
``model.safetensors`` and its optimizer shards with DCP, and resuming reads only its own part, at any world size or
mesh; another engine reads it whole. The final output is written
from the shards too (``write_model_shards``): one tensor gathered whole at a time, written by rank 0 and freed
(engines/pretrained.py).

``--bf16`` is FSDP's mixed precision (bf16 parameters in forward and backward, fp32 gradient reduction and
master weights). Refused, each in one line: ``--fp16`` (its loss scaler would have to see every rank's shards of
the gradient to find an inf; FSDP2 has no such scaler), ``--use_peft`` (LoRA's merged checkpoint needs the whole
peft model on rank 0, and LoRA's trained state is small enough for ddp or zero1 to keep whole).
"""

from __future__ import annotations

from typing import ClassVar

from horovod_train.engines.checkpoint_io import Shards, WholeState
from horovod_train.engines.parallelize import FullyShard
from horovod_train.engines.process_group import ProcessGroupEngine


class FSDPEngine(ProcessGroupEngine):
    name = "fsdp"
    parallelize = FullyShard
    checkpoint_io: ClassVar[type[WholeState]] = Shards
