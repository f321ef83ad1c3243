"""The mesh description: which ranks hold the same state (replicas) and which split it between them (shards).

``ParallelDims`` (torchtitan's name) is ``replicate`` x ``shard`` = the world; rank r sits at (r // shard, r % shard),
so the ranks of one replica are consecutive, and a node's ranks (which every launcher numbers consecutively) shard
over the node's fast links while the replicas all-reduce across nodes. ddp and zero1 are all replicas (shard 1),
fsdp all shards (replicate 1), HSDP both (``--fsdp_replicate_degree``). ``build`` makes torch's DeviceMesh from it:
1-D where one side is 1, 2-D ("replicate", "shard") otherwise, which fully_shard reads as HSDP (reduce-scatter within
a replica, all-reduce across replicas) and DCP saves as 2-D DTensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from horovod_train.common.errors import UsageError

REPLICATE, SHARD = "replicate", "shard"


@dataclass(frozen=True)
class ParallelDims:
    """The world as ``replicate`` groups of ``shard`` ranks each (torchtitan's data_parallel_replicate_degree and
    data_parallel_shard_degree)."""

    replicate: int
    shard: int

    @property
    def world_size(self) -> int:
        return self.replicate * self.shard

    @classmethod
    def replicated(cls, world_size: int) -> ParallelDims:
        """Every rank holds the whole state (ddp, zero1's model and gradients)."""
        return cls(world_size, 1)

    @classmethod
    def sharded(cls, world_size: int, local_world_size: int, replicate_degree: int) -> ParallelDims:
        """fsdp's: ``replicate_degree`` replicas (0: ``per_node``) each sharding the state over world/degree ranks.
        A degree that does not divide the world, or that leaves one rank per shard group (nothing sharded: ddp's
        job), is refused."""
        degree = replicate_degree or per_node(world_size, local_world_size)
        divisors = [d for d in range(1, world_size) if world_size % d == 0]
        if degree not in divisors and not (degree == 1 == world_size):
            why = "leaves one rank per shard group of" if degree == world_size else "does not divide"
            raise UsageError(
                f"--fsdp_replicate_degree {degree} {why} the world of {world_size} ranks",
                f"pass one of {', '.join(map(str, divisors))} (the replicas; each shards over world/degree ranks), "
                "or 0 (one replica per node), or use --engine ddp to replicate everything",
            )
        return cls(degree, world_size // degree)

    def build(self, device_type: str, timeout: timedelta | None = None) -> DeviceMesh:
        """Collective: torch's mesh over the world's ranks. ``timeout`` (--ddp_timeout, the default group's): how long
        a 2-D mesh's collectives wait for a rank (None: torch's default, 30 minutes)."""
        if self.replicate == 1 or self.shard == 1:  # the default group, and its timeout
            return init_device_mesh(device_type, (self.world_size,), mesh_dim_names=(SHARD if self.replicate == 1
                                                                                     else REPLICATE,))  # fmt: skip
        # Its groups made here, not by init_device_mesh, which gives them torch's default timeout instead of the
        # default group's: a rank that stops answering (a hung node) held HSDP's all-gathers and all-reduces for 30
        # minutes whatever --ddp_timeout said.
        ranks = torch.arange(self.world_size).reshape(self.replicate, self.shard)
        shards, _ = dist.new_subgroups_by_enumeration(ranks.tolist(), timeout=timeout)
        replicas, _ = dist.new_subgroups_by_enumeration(ranks.T.tolist(), timeout=timeout)
        return DeviceMesh.from_group([replicas, shards], device_type, mesh=ranks, mesh_dim_names=(REPLICATE, SHARD))

    def __str__(self) -> str:
        return f"{self.replicate} replicas x {self.shard} shards"


def per_node(world_size: int, local_world_size: int) -> int:
    """fsdp's default replicate degree: one replica per node where the job spans several nodes of 2+ ranks each
    (the all-gathers and reduce-scatters of every block stay on a node's links, and only the all-reduce of each
    rank's 1/local shard of the gradient crosses the network, PyTorch's HYBRID_SHARD), else 1: plain FSDP over the
    world, as on one node, or where nodes of one rank each would leave nothing sharded."""
    if local_world_size >= 2 and world_size > local_world_size and world_size % local_world_size == 0:
        return world_size // local_world_size
    return 1
