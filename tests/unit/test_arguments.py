"""Arguments on HfArgumentParser (issue 20): Literal choices, sections that check themselves, engine options
beside their engine, and bench gpu parsing train's arguments the way train does."""

from __future__ import annotations

import argparse
import dataclasses
import os
import re

import pytest

from horovod_train.bench.gpu import arguments as gpu
from horovod_train.cli.main import build_parser, hide_gpus_for_use_cpu, main, quiet_libraries
from horovod_train.common.errors import UsageError
from horovod_train.config.arguments import foreign_names, option_names, unknown_name_hint
from horovod_train.config.parsing import parse_run_config, run_field_types, sections
from horovod_train.config.run_config import RunConfig, StepIntervals, TrainingArguments
from horovod_train.engines.horovod.options import HorovodArguments

CHOICE_FIELDS = {
    "engine",
    "attn_implementation",
    "lr_scheduler_type",
    "optim",
    "eval_strategy",
    "save_strategy",
    "compression",
    "op",
    "ddp_backend",
    "torch_compile_backend",
    "torch_compile_mode",
    "log_level",
}


def _subparser(*path: str):
    parser = build_parser()
    for name in path:
        parser = parser._subparsers._group_actions[0].choices[name]
    return parser


def _help(*path: str) -> str:
    return " ".join(_subparser(*path).format_help().split())  # unwrapped


def test_every_fixed_set_is_a_literal_whose_values_are_its_domain(tmp_path):
    literals = {name: kind.choices for name, kind in run_field_types().items() if kind.choices is not None}
    assert set(literals) == CHOICE_FIELDS
    for name, choices in literals.items():
        for value in choices:  # each listed value is accepted ...
            extra = ["--engine", "horovod", "--max_grad_norm", "0"] if value == "adasum" else []
            extra += ["--save_steps", "5"] if value == "steps" and name == "save_strategy" else []
            assert parse_run_config([*extra, f"--{name}", value]).to_dict()[name] == value
        # ... and one outside refused by its domain, in the same words from the command line and a config file
        with pytest.raises(UsageError) as from_cli:
            parse_run_config([f"--{name}", "bogus"])
        (tmp_path / "c.yaml").write_text(f"{name}: bogus\n")
        with pytest.raises(UsageError) as from_file:
            parse_run_config(["--config", str(tmp_path / "c.yaml")])
        assert str(from_cli.value) == str(from_file.value) and "bogus" in str(from_cli.value)


def test_a_compile_backend_or_mode_turns_torch_compile_on_as_in_transformers():
    assert not parse_run_config([]).to_dict()["torch_compile"]
    for flag, value in (("--torch_compile_backend", "aot_eager"), ("--torch_compile_mode", "max-autotune")):
        assert parse_run_config([flag, value]).to_dict()["torch_compile"] is True
    with pytest.raises(UsageError, match="--torch_compile_mode is Inductor's"):
        parse_run_config(["--torch_compile_backend", "aot_eager", "--torch_compile_mode", "max-autotune"])
    assert (
        parse_run_config(["--torch_compile_backend", "inductor", "--torch_compile_mode", "max-autotune"]).to_dict()[
            "torch_compile_mode"
        ]
        == "max-autotune"
    )


def test_help_lists_the_choices():
    help_text = _help("train")
    assert "--eval_strategy {epoch,steps,no}" in help_text
    assert "--engine {ddp,dp,fsdp,horovod,single,zero1}" in help_text


def test_hf_argument_parser_spellings():
    """HfArgumentParser's: dashes for underscores, a bare optional bool, --no_<flag>; and ours: --name None."""
    config = parse_run_config(["--learning-rate", "1e-4", "--greater_is_better", "--metric_for_best_model", "f1",
                               "--save_total_limit", "None"])  # fmt: skip
    assert config.training.learning_rate == 1e-4 and config.training.greater_is_better is True
    assert config.training.save_total_limit is None
    with pytest.raises(UsageError, match="--do_eval false"):
        parse_run_config(["--no_do_eval"])


def test_the_command_line_overrides_a_config_file_with_none(tmp_path):
    (tmp_path / "c.yaml").write_text("save_total_limit: 5\ntokenizer_name: tiny-bert\n")
    config = parse_run_config(["--config", str(tmp_path / "c.yaml"), "--save_total_limit", "null"])
    assert config.training.save_total_limit is None and config.model.tokenizer_name == "tiny-bert"


def test_each_section_checks_itself_when_built():
    with pytest.raises(UsageError, match="--per_device_train_batch_size must be > 0"):
        TrainingArguments(per_device_train_batch_size=0)
    with pytest.raises(UsageError, match="--bf16 and --fp16 are both set"):
        TrainingArguments(bf16=True, fp16=True)
    with pytest.raises(UsageError, match="--autotune_log without --autotune"):
        HorovodArguments(autotune_log="log.csv")
    with pytest.raises(UsageError, match="--elastic needs --engine horovod"):  # between sections: RunConfig
        RunConfig(training=TrainingArguments(engine="ddp"), engine_options={"horovod": HorovodArguments(elastic=True)})


@pytest.mark.parametrize("autotune_env", [None, "1"])
def test_elastic_refuses_horovods_autotuner(monkeypatch, autotune_env):
    """The autotuner of a worker that joins is out of step with rank 0's: the job timed out after growing
    (tests/integration/test_elastic.py with HOROVOD_AUTOTUNE=1 shrank back at step 200, every time)."""
    monkeypatch.delenv("HOROVOD_AUTOTUNE", raising=False)
    if autotune_env:  # horovodrun --autotune sets it for every worker
        monkeypatch.setenv("HOROVOD_AUTOTUNE", autotune_env)
    horovod = HorovodArguments(elastic=True, autotune=autotune_env is None)
    with pytest.raises(UsageError, match="--autotune does not work with --elastic"):
        RunConfig(training=TrainingArguments(engine="horovod"), engine_options={"horovod": horovod})
    monkeypatch.setenv("HOROVOD_AUTOTUNE", "0")
    RunConfig(training=TrainingArguments(engine="horovod"), engine_options={"horovod": HorovodArguments(elastic=True)})


def test_engine_options_live_with_their_engine():
    from horovod_train.engines.ddp_options import DDPArguments
    from horovod_train.engines.horovod.options import HorovodArguments as Options

    assert sections()["horovod"] is Options and sections()["ddp"] is DDPArguments


def _bench_gpu(*argv: str) -> dict:
    args = build_parser().parse_args(["bench", "gpu", *argv])
    gpu.fill_defaults(args)
    return vars(args)


def test_bench_gpu_parses_trains_arguments_as_train_does():
    """train's style (--flag [BOOL]), bench gpu's own defaults where they differ (listed in its --help)."""
    defaults = _bench_gpu("--tiny")
    assert defaults["bf16"] is True and defaults["group_by_length"] is True and defaults["fp16"] is False
    assert defaults["per_device_train_batch_size"] == 8 and defaults["max_seq_length"] == 64
    assert defaults["output_dir"] == "runs/bench/gpu" and defaults["seed"] == 42
    assert _bench_gpu("--tiny", "--group_by_length", "false")["group_by_length"] is False
    assert _bench_gpu("--tiny", "--no_group_by_length")["group_by_length"] is False
    assert _bench_gpu("--tiny", "--no-group_by_length")["group_by_length"] is False  # its earlier spelling
    fp16 = _bench_gpu("--tiny", "--fp16")
    assert fp16["fp16"] is True and fp16["bf16"] is False
    assert _bench_gpu("--tiny", "--bf16", "false")["bf16"] is False
    gpu_help = _help("bench", "gpu")
    assert (
        "--group_by_length [BOOL], --group-by-length [BOOL] Batch examples of similar length (less padding). "
        "(default: True)" in gpu_help
    )
    assert (
        "--per_device_train_batch_size INT, --per-device-train-batch-size INT Examples per rank per micro-step. "
        "(default: 128; tiny 8)" in gpu_help
    )


def _arguments(*path: str) -> dict:
    """Each argument by its name (not its --no_ twin): (type's name, help without the default)."""
    return {a.option_strings[0]: (getattr(a.type, "__name__", None), a.help.split(" (default: ")[0])
            for a in _subparser(*path)._actions if a.option_strings}  # fmt: skip


def test_bench_gpu_takes_trains_fields_with_trains_types_and_help():
    gpu_arguments, train_arguments = _arguments("bench", "gpu"), _arguments("train")
    for name in (*gpu.TRAINING_FIELDS, *gpu.DATA_FIELDS):
        assert gpu_arguments[f"--{name}"] == train_arguments[f"--{name}"]
    assert {f.name for f in dataclasses.fields(gpu.GpuBenchArguments)}.isdisjoint(gpu.TRAINING_FIELDS)


def _refused(capsys, argv: list[str]) -> str:
    """The command's one `error: ...; fix: ...` line (exit 2)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["train", "--no_such_flag", "1"], "horovod-train train"),
        (["bench", "train", "--no_such_flag"], "horovod-train bench train"),
        (["doctor", "--no_such_flag"], "horovod-train doctor"),
    ],
)
def test_an_unknown_flag_points_to_the_help_of_its_subcommand(capsys, argv, command):
    """The top-level --help lists subcommands only: the hint names the one that lists the flags."""
    line = _refused(capsys, argv)
    assert "unrecognized arguments: --no_such_flag" in line and line.endswith(f"fix: see `{command} --help`"), line


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        (["--mixed_precision", "bf16"], "for --mixed_precision, did you mean --bf16?"),
        (["--mixed-precision=fp16"], "for --mixed-precision, did you mean --fp16?"),  # accelerate launch's spelling
        (["--mixed_precision", "no"], "for --mixed_precision, drop it: fp32 is the default."),
        (["--evaluation_strategy", "steps"], "for --evaluation_strategy, did you mean --eval_strategy?"),
        (["--logging_dir", "logs"], "for --logging_dir, did you mean --report_to tensorboard? Its event files go"),
        (["--logging_strategy", "steps"], "for --logging_strategy, did you mean --logging_steps N?"),
        (
            ["--per_gpu_train_batch_size", "8"],
            "for --per_gpu_train_batch_size, did you mean --per_device_train_batch_size?",
        ),
        (["--local_rank=0"], "for --local_rank, drop it"),
        (["--num_epochs", "3"], "for --num_epochs, did you mean --num_train_epochs?"),  # a close misspelling
        # the Trainer's switches (issue 58): --fsdp was "ambiguous option", the others a bare "see --help"
        (["--fsdp", "full_shard"], "for --fsdp, did you mean --engine fsdp (launched by torchrun)?"),
        (
            ["--deepspeed", "ds.json"],
            "for --deepspeed, DeepSpeed is not supported; for its ZeRO sharding use --engine zero1",
        ),
        (["--no_cuda"], "for --no_cuda, did you mean --use_cpu?"),
        (["--eval_accumulation_steps", "4"], "for --eval_accumulation_steps, drop it: evaluation moves"),
        (["--push_to_hub"], "for --push_to_hub, not supported"),
        (
            ["--logging_first_step"],
            "for --logging_first_step, transformers' Trainer takes --logging_first_step; "
            "this project has no such option.",
        ),
    ],
)
def test_names_from_transformers_and_accelerate_get_this_projects_name(capsys, given, hint):
    line = _refused(capsys, ["train", *given])
    assert f"fix: {hint}" in line and line.endswith("See `horovod-train train --help`"), line


def test_every_trainer_argument_is_taken_or_gets_a_hint():
    """Each field of transformers' TrainingArguments is one of train's flags, or refused with a line of its own."""
    import transformers

    known = option_names(_subparser("train"))
    for f in dataclasses.fields(transformers.TrainingArguments):
        if f.init and f"--{f.name}" not in known:
            assert unknown_name_hint(f"--{f.name}", None, known), f.name


def test_trainer_and_run_glue_flags_are_taken_under_their_names():
    config = parse_run_config(["--use_cpu", "--log_level", "info", "--save_safetensors", "--max_predict_samples", "5"])
    assert (config.training.use_cpu, config.training.log_level, config.data.max_predict_samples) == (True, "info", 5)
    with pytest.raises(UsageError, match="safetensors only"):
        parse_run_config(["--save_safetensors", "false"])


def test_step_intervals_take_the_trainers_ratios():
    """A float in (0, 1) is that share of the run's steps, rounded up (as transformers' Trainer); a whole number
    is steps; the default logs at least every 2% of a short run."""
    config = parse_run_config(["--logging_steps", "0.05", "--eval_steps", "0.1", "--save_steps", "0.25"])
    assert config.training.step_intervals(75) == StepIntervals(logging=4, eval=8, save=19)
    config = parse_run_config(["--logging_steps", "1e1", "--save_steps", "20.0"])
    assert config.to_dict()["logging_steps"] == 10 and isinstance(config.to_dict()["logging_steps"], int)
    assert config.training.step_intervals(75) == StepIntervals(logging=10, eval=10, save=20)
    defaults = parse_run_config([]).training
    assert [defaults.step_intervals(n).logging for n in (10, 75, 1000, 10000)] == [1, 2, 20, 50]
    assert defaults.step_intervals(75).eval == 50
    for bad in ("2.5", "0", "-0.5"):
        with pytest.raises(UsageError, match="--eval_steps must be a whole number >= 1 of steps, or a ratio"):
            parse_run_config(["--eval_steps", bad])


def test_best_model_takes_ratio_intervals_in_one_form():
    best = ["--load_best_model_at_end", "--eval_strategy", "steps", "--save_strategy", "steps"]
    assert parse_run_config([*best, "--eval_steps", "0.1", "--save_steps", "0.2"]).training.save_steps == 0.2
    with pytest.raises(UsageError, match="both in steps or both as ratios"):
        parse_run_config([*best, "--eval_steps", "10", "--save_steps", "0.2"])
    with pytest.raises(UsageError, match="multiple of the evaluation interval"):
        parse_run_config([*best, "--eval_steps", "0.1", "--save_steps", "0.25"])


def test_use_cpu_hides_gpus_and_log_level_sets_the_libraries(monkeypatch):
    import logging

    import transformers

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    hide_gpus_for_use_cpu(parse_run_config([]).training)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
    hide_gpus_for_use_cpu(parse_run_config(["--use_cpu"]).training)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    try:
        quiet_libraries("info")
        assert transformers.logging.get_verbosity() == logging.INFO
    finally:
        quiet_libraries()
    assert transformers.logging.get_verbosity() == logging.ERROR


def test_every_flag_the_hints_name_is_one_of_trains():
    options = set(_subparser("train")._option_string_actions)
    for hints in foreign_names().values():
        for hint in hints.values():
            for flag in re.findall(r"(?<!torchrun )(--\w+)", hint):
                assert flag in options, (flag, hint)


def test_a_config_files_unknown_key_gets_the_same_hints(tmp_path):
    (tmp_path / "c.yaml").write_text("evaluation_strategy: epoch\nlearning_rat: 1.0e-4\n")
    with pytest.raises(UsageError) as error:
        parse_run_config(["--config", str(tmp_path / "c.yaml")])
    assert "unknown key(s)" in error.value.problem and error.value.fix == (
        "for evaluation_strategy, did you mean --eval_strategy? For learning_rat, did you mean --learning_rate? "
        "See `horovod-train train --help`"
    )


def test_each_help_says_its_default_once():
    """A help text that describes its own default gets no second `(default: None)` from the field."""
    parser, todo = build_parser(), []
    todo.append(parser)
    while todo:
        current = todo.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo += action.choices.values()
            elif action.help:
                said = re.findall(r"\(default|default:|defaults to", action.help, re.IGNORECASE)
                assert len(said) <= 1, (current.prog, action.option_strings, action.help)
