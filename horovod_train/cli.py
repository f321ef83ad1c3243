"""Command line: `python -m horovod_train train ...` (console script: `horovod-train`)."""

from __future__ import annotations

import argparse
import os
import sys

from horovod_train import bench, compare, doctor
from horovod_train.config import Parser, add_run_arguments, parse_run_config
from horovod_train.errors import UsageError, exit_with
from horovod_train.stopping import STOPPED_EXIT_CODE, TrainingStopped


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="horovod-train", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    train = commands.add_parser("train", help="fine-tune a sequence-classification model")
    add_run_arguments(train)
    compare_parser = commands.add_parser("compare", help="run one job under every engine and tabulate them")
    compare.add_arguments(compare_parser)
    doctor_parser = commands.add_parser("doctor", help="print the rank/host/device map and Horovod's build")
    doctor.add_arguments(doctor_parser)
    bench.add_arguments(commands.add_parser("bench", help="all-reduce, training and GPU benchmarks"))
    for command in (train, compare_parser):
        command.add_argument("--debug", action="store_true", help="Show tracebacks for bad input.")
    return parser


def quiet_libraries() -> None:
    import datasets
    import transformers

    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars


def cmd_train(args: argparse.Namespace) -> int:
    from horovod_train.engines import create_engine
    from horovod_train.files import check_output_dir
    from horovod_train.trainer import Trainer

    config = parse_run_config(namespace=args)
    quiet_libraries()
    engine = create_engine(config)
    training = config.training
    if not engine.joins_running_job(training.output_dir):  # resuming continues the run already there
        check_output_dir(training.output_dir, training.overwrite_output_dir or bool(training.resume_from_checkpoint))
    try:
        with engine.running():
            results = Trainer(config, engine).train()
    except TrainingStopped as stopped:
        if engine.is_main:
            print(stopped.message, flush=True)
        return STOPPED_EXIT_CODE
    if engine.is_main:
        out = config.training.output_dir
        print(
            f"accuracy {results['accuracy']:.4f} on {results['eval_samples']} validation examples "
            f"({results['engine']}, world size {results['world_size']}, {results['wall_time_s']:.1f}s)"
        )
        print(f"wrote {out}/: model + tokenizer (save_pretrained), metrics.jsonl, eval_results.json, run_config.json")
    return 0


COMMANDS = {"train": cmd_train, "compare": compare.main, "doctor": doctor.main, "bench": bench.main}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv or os.environ.get("HOROVOD_TRAIN_DEBUG") == "1"
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UsageError as error:
        if debug:
            raise
        exit_with(error)
    return 0
