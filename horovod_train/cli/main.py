"""Command line: `python -m horovod_train train ...` (console script: `horovod-train`)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from horovod_train.bench.runs import TRACE_DIR_VARIABLE
from horovod_train.common.console import write_line
from horovod_train.common.errors import UsageError, exit_with
from horovod_train.config.arguments import FALSE_VALUES, TRUE_VALUES, ArgumentParser, add_dataclass_arguments
from horovod_train.config.parsing import CONFIG_HELP, add_sections, parse_run_config
from horovod_train.config.run_config import RunConfig, TrainingArguments
from horovod_train.engines.joining import check_launch
from horovod_train.launching import environment
from horovod_train.outputs.run_directory import RunDirectory
from horovod_train.tasks.scores import METRIC_NAMES
from horovod_train.training.stopping import STOPPED_EXIT_CODE, TrainingStopped

if TYPE_CHECKING:
    from horovod_train.engines.base import Engine


@dataclass
class DebugArguments:
    debug: bool = field(default=False, metadata={"help": "Show tracebacks for bad input."})


@dataclass(frozen=True)
class Command:
    """A subcommand: its help, and the module holding its ``add_arguments(parser)`` and ``main(args)``."""

    help: str
    module: str
    add: str = "add_arguments"
    main: str = "main"
    debug: bool = False  # takes --debug
    nested: bool = False  # its arguments depend on its next word (bench's benchmark): add(parser, rest)

    def function(self, name: str) -> Callable:
        return getattr(importlib.import_module(self.module), name)


# Only the command a command line names is imported and given its arguments: bench's and train's modules import
# torch and transformers (5 s of CPU), which `--help`, a mistyped flag and a parent that only launches (compare,
# bench train) do without.
COMMANDS = {
    "train": Command(
        "fine-tune a sequence-classification model", "horovod_train.cli.main", "add_train_arguments", "cmd_train", True
    ),
    "compare": Command(
        "run one job under every engine and tabulate them", "horovod_train.launching.compare", debug=True
    ),
    "doctor": Command("print the rank/host/device map and Horovod's build", "horovod_train.cli.doctor"),
    "bench": Command("all-reduce, training and GPU benchmarks", "horovod_train.bench", nested=True),
    "checkpoint": Command(
        "write a checkpoint's whole, sharded or Trainer form", "horovod_train.outputs.checkpoint_convert"
    ),
    "build-horovod": Command("build Horovod for this environment's torch", "horovod_train.build_horovod.command"),
}


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command's parser; with ``argv``, only the command it names (its first word) gets its arguments."""
    parser = ArgumentParser(prog="horovod-train", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)
    for name, command in COMMANDS.items():
        subparser = commands.add_parser(name, help=command.help)
        if argv is None or argv[:1] == [name]:
            add = command.function(command.add)
            if command.nested:
                add(subparser, None if argv is None else argv[1:])
            else:
                add(subparser)
            if command.debug:
                add_dataclass_arguments(subparser, DebugArguments)
    return parser


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Fine-tune a sequence-classification model data-parallel."
    add_sections(parser)
    parser.add_argument("--config", help=CONFIG_HELP)


def debug_requested(argv: list[str]) -> bool:
    """Before parsing (a parse error must know it too): ``--debug`` alone or with a true value."""
    for i, arg in enumerate(argv):
        if arg.startswith("--debug="):
            return arg.split("=", 1)[1].lower() in TRUE_VALUES
        if arg == "--debug":
            following = argv[i + 1].lower() if i + 1 < len(argv) else ""
            return following in TRUE_VALUES or following not in FALSE_VALUES
    return False


def quiet_libraries(log_level: str = "passive") -> None:
    """transformers' and datasets' progress bars off, and their logs at --log_level (passive: errors only)."""
    import logging

    import datasets
    import transformers

    level = logging.ERROR if log_level == "passive" else getattr(logging, log_level.upper())
    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(level)
    transformers.logging.set_verbosity(level)
    transformers.logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars


def hide_gpus_for_use_cpu(training: TrainingArguments) -> None:
    """--use_cpu: no GPU visible to this process and its children, set before torch first looks for one, so that
    every engine picks the CPU (and DDP Gloo) as it does on a machine without a GPU."""
    if training.use_cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def cmd_train(args: argparse.Namespace) -> int:
    config = parse_run_config(namespace=args)  # bad flags are refused before torch and transformers load
    check_launch(config.training.engine)  # the environment's variables and the launcher's world, too
    refuse_output_dir_early(config)

    from horovod_train.engines import create_engine
    from horovod_train.models.model import fit_max_seq_length

    hide_gpus_for_use_cpu(config.training)
    quiet_libraries(config.training.log_level)
    fit_max_seq_length(config, warn=warn_on_rank_0)
    engine = create_engine(config)
    training = config.training
    stopped = None
    # The trainer (DDP's wrapped model and its reducer) must be gone before the engine shuts the process group
    # down: destroyed after it, it hung the process at exit. So it lives in train_once's frame, and a stop's
    # traceback (which holds that frame) is dropped inside the block too.
    with engine.running():
        try:
            results, wrote = train_once(config, engine)
        except TrainingStopped as error:
            stopped = error.message
    if stopped is not None:
        if engine.is_main:
            write_line(stopped)
        return STOPPED_EXIT_CODE
    if engine.is_main and wrote:
        write_line(f"wrote {training.output_dir}/: {', '.join(wrote)}")
    if engine.is_main:  # the result is the last line, whatever the launcher adds before it
        write_line(result_line(results))
    return 0


def refuse_output_dir_early(config: RunConfig) -> None:
    """A one-process run judges --output_dir (and a named checkpoint) before torch loads: a refused directory costs
    a second, not the start (the trainer judges it again under the lock). Not a job of several ranks: rank 0's exit
    before the others have started would have the launcher kill them while they import, and report them killed
    by its signal (horovodrun's shell prints `Terminated`) where they otherwise exit 2 quietly, as rank 0 does."""
    launched = launcher_view()
    if launched is None or launched.world_size != 1 or config.workers_join_running_job():
        return  # None: the launcher's variables make no sense, which the engine says once it starts
    training = config.training
    run_dir = RunDirectory(training.output_dir, reads=config.model.reads())
    run_dir.refuse_early(training.overwrite_output_dir, training.resume_from_checkpoint)


def warn_on_rank_0(message: str) -> None:
    """Before the engine joins the job: rank 0 by the launcher's variables."""
    if launch_rank() == 0:
        write_line(message, sys.stderr)


def launcher_view() -> environment.DistEnv | None:
    """This process's place in its job by its launcher's variables, before the engine joins it; None where they
    make no sense (the engine says so once it starts)."""
    try:
        return environment.detect(resolve_master=False)
    except UsageError:
        return None


def launch_rank() -> int:
    """This process's rank by its launcher's variables (0 without a launcher, and where they make no sense: then
    it speaks)."""
    launched = launcher_view()
    return 0 if launched is None else launched.rank


def train_once(config: RunConfig, engine: Engine) -> tuple[dict, list[str]]:
    """The run's results, and the top-level names it wrote in --output_dir (none for a finished run resumed)."""
    from horovod_train.training.trainer import Trainer

    trainer = Trainer(config, engine)
    results = trainer.train()
    return results, trainer.run_dir.outputs()


def split_scores(results: dict, split: str) -> str:
    """``validation accuracy 0.9000 (f1 0.8000, 100 examples; chance 0.33)``: the split's name, its first metric,
    then its others."""
    metrics = {name: v for k, v in results.items() if (name := k.removeprefix(split + "_")) in METRIC_NAMES}
    shown = [f"{k} {v:.4f}" for k, v in metrics.items()]
    # The primary split's metrics are eval_<metric>; all_results.json of a run before its name was recorded lacks it.
    name = results.get("validation_split", "validation") if split == "eval" else split.removeprefix("eval_")
    rest = ", ".join([*shown[1:], f"{results[split + '_samples']} examples"])
    from horovod_train.tasks.registry import chance_accuracy  # the shapes import datasets: not for every start

    chance = chance_accuracy(results) if next(iter(metrics), None) == "accuracy" else None
    rest += f"; chance {chance:.2g}" if chance else ""
    return f"{name} {shown[0]} ({rest})" if shown else f"{name} {rest}"


def result_line(results: dict) -> str:
    splits = sorted(k.removesuffix("_samples") for k in results if k.endswith("_samples") and k.startswith("eval"))
    scores = ", ".join(split_scores(results, s) for s in splits)
    return f"{scores}; {results['engine']}, world size {results['world_size']}, {results['wall_time_s']:.1f}s"


CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "train" and argv[1].endswith(CONFIG_SUFFIXES) and not argv[1].startswith("-"):
        argv = ["train", "--config", argv[1]]  # run_glue.py's `python run_glue.py args.json`
    debug = debug_requested(argv) or os.environ.get("HOROVOD_TRAIN_DEBUG") == "1"
    try:
        args = build_parser(argv).parse_args(argv)
        command = COMMANDS[args.command]
        run = command.function(command.main)
        if os.environ.get(TRACE_DIR_VARIABLE):  # a rank `bench trace` launched: it records its steps' parts
            from horovod_train.bench.runs.traced import recording

            with recording(Path(os.environ[TRACE_DIR_VARIABLE])):
                return run(args)
        return run(args)
    except UsageError as error:
        if debug:
            raise
        exit_with(error, rank=launch_rank())
    return 0
