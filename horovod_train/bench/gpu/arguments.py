"""bench gpu's arguments: its own (GpuBenchArguments), and train's that it takes, parsed and checked as train parses
them; its defaults, tiny (on the CPU) or full."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import torch

from horovod_train.bench.architectures import DECODERS, MODELS, TINY_OF, model_config
from horovod_train.bench.engine_names import engine_names
from horovod_train.common.errors import UsageError
from horovod_train.config import domains
from horovod_train.config.arguments import add_dataclass_arguments, field_default, given
from horovod_train.config.run_config import DataArguments, TrainingArguments

ENGINES = engine_names("single", "horovod")  # those that run in this one process, at world size 1
# The single engine's step in the forms issue 59 compares (--variants), each on the same examples: padded per
# batch (eager, as the engines' rows), padded to --length_buckets lengths, compiled (Inductor, a graph per
# bucket), compiled with CUDA graphs (reduce-overhead), padding-free (a decoder's, --model tiny-llama or
# decoder-0.5b: BERT has no such form), and the bucketed step through the training loop itself (loop: its loader,
# meter, schedule and log line; compared with the bucketed row, which it brings along).
VARIANTS = ("eager", "bucketed", "compiled", "cudagraphs", "padding_free", "loop")
# bench gpu's defaults where they differ from train's (its --help shows them): the size-dependent ones
# (tiny, full), then the others.
SIZES = {"per_device_train_batch_size": (8, 128), "steps": (3, 50), "warmup": (1, 10), "max_seq_length": (64, 128)}
DEFAULTS = {
    "output_dir": "runs/bench/gpu",
    "bf16": True,
    "group_by_length": True,
    "length_buckets": 4,
}  # bf16: false with --fp16
SHOWN_DEFAULTS = {**{name: f"{full}; tiny {tiny}" for name, (tiny, full) in SIZES.items()}, **DEFAULTS,
                  "bf16": "True (False with --fp16; --bf16 false without --fp16: fp32)",
                  "peak_tflops": "by device name, PEAK_BF16_TFLOPS"}  # fmt: skip
# train's arguments that bench gpu takes, parsed as train parses them (their domains are train's).
TRAINING_FIELDS = ("output_dir", "per_device_train_batch_size", "seed", "bf16", "fp16", "torch_compile",
                   "group_by_length")  # fmt: skip
DATA_FIELDS = ("max_seq_length", "length_buckets")


@dataclass
class GpuBenchArguments:
    """bench gpu's own options; its training arguments are train's (TRAINING_FIELDS, DATA_FIELDS)."""

    _argument_group_name = "bench gpu arguments"

    model: str = field(default="bert-base-cased", metadata={"help": "The architecture (random init).",
                                                              "choices": [*MODELS, *DECODERS]})  # fmt: skip
    tiny: bool = field(default=False, metadata={
        "help": "The architecture's tiny one (tiny-bert, or tiny-llama for a decoder), few small steps (automatic "
                "without CUDA)."})  # fmt: skip
    steps: int | None = field(default=None, metadata={"help": "Timed steps per window."})
    warmup: int | None = field(default=None, metadata={"help": "Untimed steps first."})
    repeats: int = field(default=3, metadata={"help": "Timing windows per engine, interleaved."})
    mean_length: float = field(default=40.0, metadata={"help": "Mean tokens per example (MNLI: ~40)."})
    min_length: int = field(default=8, metadata={"help": "Fewest tokens of an example."})
    peak_tflops: float | None = field(default=None, metadata={"help": "Dense bf16 peak TFLOP/s for MFU."})
    engines: list[str] = field(default_factory=lambda: list(ENGINES),
                               metadata={"help": "Engines to time.", "choices": ENGINES})  # fmt: skip
    variants: list[str] = field(default_factory=list, metadata={
        "help": "The single engine's step in other forms, timed beside the engines: bucketed (--length_buckets), "
                "compiled, cudagraphs (both bucketed); padding_free is a decoder's (--model tiny-llama or "
                "decoder-0.5b; BERT: a row saying why not); loop is the bucketed step through `train`'s training "
                "loop (its loader, meter, schedule, log line), beside the bucketed row (added if not asked for): "
                "their ratio is what the loop adds.",
        "choices": VARIANTS})  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_dataclass_arguments(parser, GpuBenchArguments, shown=SHOWN_DEFAULTS)
    add_dataclass_arguments(parser, TrainingArguments, only=TRAINING_FIELDS, shown=SHOWN_DEFAULTS)
    add_dataclass_arguments(parser, DataArguments, only=DATA_FIELDS, shown=SHOWN_DEFAULTS)
    # HfArgumentParser's --no_<flag> for a flag that defaults to true (here), and this command's earlier spelling.
    parser.add_argument("--no_group_by_length", "--no-group_by_length", dest="group_by_length", action="store_false",
                        default=None, help="The same as --group_by_length false. (default: not given)")  # fmt: skip


def fill_defaults(args: argparse.Namespace) -> None:
    """What the command line left out (None): bench gpu's defaults (tiny or full sizes), else the fields'."""
    tiny = bool(args.tiny) or not torch.cuda.is_available()
    own = {**DEFAULTS, **{name: sizes[0 if tiny else 1] for name, sizes in SIZES.items()}}
    if args.fp16:
        own["bf16"] = False
    fields_defaults = {f.name: field_default(f) for f in dataclasses.fields(GpuBenchArguments)}
    fields_defaults |= {f.name: field_default(f) for f in dataclasses.fields(TrainingArguments)
                        if f.name in TRAINING_FIELDS}  # fmt: skip
    fields_defaults |= {f.name: field_default(f) for f in dataclasses.fields(DataArguments) if f.name in DATA_FIELDS}
    given_values = {**given(args, GpuBenchArguments), **given(args, TrainingArguments), **given(args, DataArguments)}
    vars(args).update({**fields_defaults, **own, **given_values, "tiny": tiny})
    if tiny:
        args.model = TINY_OF.get(args.model, args.model)
    if "loop" in args.variants and "bucketed" not in args.variants:  # the bare step the loop is compared with
        at = args.variants.index("loop")
        args.variants = [*args.variants[:at], "bucketed", *args.variants[at:]]


def resolve(args: argparse.Namespace) -> None:
    """Fill the defaults (tiny or full) and check every argument against its domain."""
    fill_defaults(args)
    if args.bf16 and args.fp16:
        raise UsageError("--bf16 and --fp16 are both set", "choose one of them")
    args.precision = "fp16" if args.fp16 else "fp32" if args.bf16 is False else "bf16"
    domains.writable_dir("output_dir", args.output_dir)
    domains.Number(0.0, low_open=True, example="989")("peak_tflops", args.peak_tflops)  # None: by GPU name
    sizes = ("per_device_train_batch_size", "steps", "repeats", "min_length")
    positive = {k: getattr(args, k) for k in sizes}
    bad = [f"--{k} {v}" for k, v in positive.items() if v <= 0]
    if bad or args.warmup < 0 or not args.min_length <= args.mean_length <= args.max_seq_length:
        raise UsageError(
            f"bad benchmark sizes ({', '.join(bad) or 'lengths'})",
            "use positive sizes and --min_length <= --mean_length <= --max_seq_length",
        )
    positions = model_config(args.model).max_position_embeddings
    if args.max_seq_length > positions:
        raise UsageError(
            f"--max_seq_length {args.max_seq_length} is more than {args.model}'s {positions} positions",
            f"pass --max_seq_length {positions} or less",
        )
    TrainingArguments(**{name: getattr(args, name) for name in TRAINING_FIELDS})  # train's domains (--seed ...)
    DataArguments(**{name: getattr(args, name) for name in DATA_FIELDS})  # --length_buckets ...


def validate(args: argparse.Namespace) -> None:
    """The argument checks ``main`` runs first (``resolve``), for callers that only check."""
    resolve(args)
