"""The engines' memory model, one part per way the training state is spread: what a rank holds, what a save
gathers on rank 0 and what a save beside training (--save_async) copies. Each engine's row names its part
(``EngineSpec.memory``, engines/specs.py); class methods, asked before any engine exists by the memory check before
start and `bench memory`/`bench fit`. Reading a part imports no torch. Per trained parameter: fp32 weights (4),
gradient (4), AdamW's two moments (8); per frozen one its weights. ``replicate_degree``: the ranks that hold the
same shard (HSDP's replicas), 1 elsewhere.
"""

from __future__ import annotations


class Replicated:
    """Every rank holds the whole model, its gradients and the optimizer's state (single, dp, horovod, ddp)."""

    # Every rank holds the whole state (`bench fit` models these engines on one GPU).
    whole_state = True

    @classmethod
    def state_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        return 4 * params + 12 * trainable

    @classmethod
    def save_gather_bytes(
        cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1, largest: int = 0
    ) -> float:
        """Nothing: every rank holds the whole state already."""
        return 0.0

    @classmethod
    def save_copy_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        """What a rank copies at a save beside training (--save_async) and holds until its write ends: nothing here,
        as a whole state is saved at once (training/saving.py writes in the background only a sharded one)."""
        return 0.0

    @classmethod
    def buffer_bytes(cls, trainable: int, fusion_bytes: float) -> float:
        """What the engine's reduction holds beside the gradients on a GPU (`bench fit`): nothing here."""
        return 0.0

    @classmethod
    def peak_bytes(
        cls,
        params: int,
        trainable: int,
        world_size: int,
        activations: float,
        replicate_degree: int = 1,
        largest: int = 0,
        save_async: bool = False,
    ) -> dict[str, float]:
        """A rank's peak, by part: the process's base, the training state, ``activations``, a save's gather
        (``largest``: the elements of the model's largest tensor) and, ``save_async``, a save's copy."""
        from horovod_train.training import peak_memory  # imports torch: only when a peak is counted

        copy = cls.save_copy_bytes(params, trainable, world_size, replicate_degree) if save_async else 0.0
        return {
            "base": peak_memory.BASE_BYTES,
            "state": cls.state_bytes(params, trainable, world_size, replicate_degree),
            "activations": activations,
            "save gather": cls.save_gather_bytes(params, trainable, world_size, replicate_degree, largest),
            "save copy": copy,
        }


class FusionBuffered(Replicated):
    """Horovod: the whole state on every rank, and a fusion buffer (HOROVOD_FUSION_THRESHOLD, at most the
    gradients) the all-reduce packs gradients into."""

    @classmethod
    def buffer_bytes(cls, trainable: int, fusion_bytes: float) -> float:
        return min(fusion_bytes, 4 * trainable)


class GatheredOnOne(Replicated):
    """nn.DataParallel: the replicas' gradients are summed on the first GPU, a second gradient's worth there."""

    @classmethod
    def buffer_bytes(cls, trainable: int, fusion_bytes: float) -> float:
        return 4 * trainable


class OptimizerSharded(Replicated):
    """ZeRO-1: the whole model and gradient, AdamW's moments of 1/W of the parameters."""

    whole_state = False

    @classmethod
    def state_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        return 4 * params + 4 * trainable + 8 * trainable / world_size

    @classmethod
    def save_copy_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        """Its AdamW moments (checkpoint_io.OptimizerShards; rank 0 writes the whole model at once)."""
        return 8 * trainable / world_size


class FullySharded(Replicated):
    """FSDP: weights, gradients and AdamW's state over the shard group's world/``replicate_degree`` ranks."""

    whole_state = False

    @classmethod
    def state_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        return (4 * params + 12 * trainable) / (world_size // replicate_degree)

    @classmethod
    def save_copy_bytes(cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1) -> float:
        """Its shard of the fp32 weights and of AdamW's two moments (measured: +1.6 GiB a rank at 0.25 B over 2,
        docs/performance.md)."""
        return (4 * params + 8 * trainable) / (world_size // replicate_degree)

    @classmethod
    def save_gather_bytes(
        cls, params: int, trainable: int, world_size: int, replicate_degree: int = 1, largest: int = 0
    ) -> float:
        """The run's final output: one fp32 tensor whole at a time, on every rank (``write_model_shards``,
        engines/pretrained.py); checkpoints are written in shards, nothing gathered."""
        return 4 * largest
