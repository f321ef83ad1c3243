"""`horovod-train bench ...`: all-reduce, training-throughput and GPU benchmarks (see docs/performance.md). One idea
per room: communication/ (the collective alone), runs/ (real `train` launches, measured), gpu/ (one GPU's step, in
process), models/ (analytic, nothing launched); beside them what several share: units, bandwidth, buckets,
architectures, outputs and engine_names (the engines bench names, from the engine table)."""

from __future__ import annotations

import argparse
import importlib

# subcommand -> (its module under bench/, help)
BENCHMARKS = {
    "allreduce": ("communication.allreduce", "Horovod vs torch.distributed all-reduce (run it under a launcher)"),
    "allreduce-sweep": (
        "communication.sweep",
        "launch `bench allreduce` per controller, fusion threshold and cycle time",
    ),
    "train": ("runs.train", "samples/s per engine and world size, scaling efficiency, Horovod/DDP ratio"),
    "trace": ("runs.trace", "where a step's time goes per engine: compute, all-reduce, copies, waiting (traced)"),
    "project": ("models.project", "predicted samples/s and scaling efficiency, 1 to 1024 GPUs (alpha-beta model)"),
    "memory": ("runs.memory", "full fine-tuning vs gradient checkpointing vs LoRA: all-reduced bytes, speed, peak RSS"),
    "gpu": ("gpu.benchmark", "BERT-base training throughput and MFU on one GPU: plain vs Horovod np=1"),
}


def _module(name: str):
    return importlib.import_module(f"{__name__}.{BENCHMARKS[name][0]}")


def add_arguments(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> None:
    """Every benchmark's parser; with ``argv`` (the words after `bench`), only the one it names gets its
    arguments: the others' modules (gpu.benchmark imports torch and transformers) stay unimported."""
    benchmarks = parser.add_subparsers(dest="benchmark", required=True, parser_class=type(parser))
    for name, (_, help_text) in BENCHMARKS.items():
        subparser = benchmarks.add_parser(name, help=help_text, description=help_text)
        if argv is None or argv[:1] == [name]:
            _module(name).add_arguments(subparser)


def main(args: argparse.Namespace) -> int:
    return _module(args.benchmark).main(args)
