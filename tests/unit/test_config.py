"""Config: run_glue-style arguments, YAML/JSON --config, CLI over config, unknown keys refused."""

from __future__ import annotations

import json

import pytest

from horovod_train.common.errors import UsageError
from horovod_train.config.parsing import parse_run_config
from horovod_train.config.run_config import TrainingArguments
from horovod_train.engines import available_engines, create_engine, specs


def test_defaults_are_the_embedded_job():
    config = parse_run_config([])
    assert config.model.model_name_or_path == "tiny-bert"
    assert config.data.dataset_name == "synthetic-nli"
    assert config.training.engine == "horovod"
    assert config.training.per_device_train_batch_size == 32


def test_cli_overrides_yaml_config(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("learning_rate: 3.0e-4\nper_device_train_batch_size: 8\noverwrite_output_dir: true\n")
    config = parse_run_config(["--config", str(path), "--per_device_train_batch_size", "4"])
    assert config.training.learning_rate == 3e-4
    assert config.training.per_device_train_batch_size == 4
    assert config.training.overwrite_output_dir is True


def test_json_config_and_optional_values(tmp_path):
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"max_train_samples": 100, "tokenizer_name": None, "num_train_epochs": 2}))
    config = parse_run_config(["--config", str(path)])
    assert config.data.max_train_samples == 100 and config.model.tokenizer_name is None
    assert config.training.num_train_epochs == 2.0


def test_boolean_flags_accept_bare_and_valued_forms():
    assert parse_run_config(["--overwrite_output_dir"]).training.overwrite_output_dir is True
    assert parse_run_config(["--overwrite_output_dir", "false"]).training.overwrite_output_dir is False


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("learning_rat: 1e-4\n", "unknown key(s)"),
        ("learning_rate: [1, 2\n", "malformed"),
        ("- a\n- b\n", "not a mapping"),
        ("per_device_train_batch_size: many\n", "not a valid int"),
        ("per_device_train_batch_size: 1.5\n", "not a valid int"),
    ],
)
def test_bad_config_files_are_refused(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_run_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--per_device_train_batch_size", "0"], "must be > 0"),
        (["--learning_rate", "-1"], "learning_rate must be > 0"),
        (["--compression", "int8"], "unknown --compression"),
        (["--op", "max"], "unknown --op"),
        (["--op", "adasum", "--gradient_predivide_factor", "2"], "only applies to --op average"),
        (["--num_train_epochs", "0"], "nothing to train"),
        (["--per_device_train_batch_size", "two"], "invalid int value"),
        (["--no_such_flag", "1"], "unrecognized arguments"),
    ],
)
def test_bad_arguments_are_refused(argv, message):
    with pytest.raises(UsageError, match=message):
        parse_run_config(argv)


def test_engine_registry_finds_engine_modules():
    engines = available_engines()
    assert "horovod" in engines and "single" in engines
    for name, cls in engines.items():
        assert cls.name == name


def test_unknown_engine_is_refused_with_the_choices():
    with pytest.raises(UsageError, match="unknown engine 'nope'.*horovod"):
        parse_run_config(["--engine", "nope"])
    config = parse_run_config([])
    config.training.engine = "nope"  # set after parsing: create_engine refuses it too
    with pytest.raises(UsageError, match="unknown engine 'nope'.*horovod"):
        create_engine(config)


def test_trains_default_engine_is_the_first_row_and_a_config_file_is_checked_like_the_command_line(tmp_path):
    """TrainingArguments.engine's default is the one engine name written outside the rows (run_config.py reads no
    row): the first, the most preferred. A config file's engine meets the same check as --engine's."""
    assert TrainingArguments().engine == next(iter(specs.ENGINES)) == parse_run_config([]).training.engine
    (tmp_path / "c.yaml").write_text("engine: nope\n")
    with pytest.raises(UsageError, match="unknown engine 'nope'; fix: use --engine ddp or dp or fsdp or horovod"):
        parse_run_config(["--config", str(tmp_path / "c.yaml")])


def test_packaged_demo_config_is_found_by_name():
    config = parse_run_config(["--config", "demo"])
    assert config.data.synthetic_num_examples == 8000 and config.training.output_dir == "runs/demo"
    with pytest.raises(UsageError, match="config file nope does not exist"):
        parse_run_config(["--config", "nope"])


def test_only_an_elastic_run_lets_workers_join_it():
    """Where workers join a running job, rank 0 at a process's start does not own the output directory: the early
    look at it (cli.refuse_output_dir_early) is left to the trainer."""
    assert not parse_run_config(["--engine", "horovod"]).workers_join_running_job()
    assert not parse_run_config(["--engine", "ddp"]).workers_join_running_job()
    assert parse_run_config(["--engine", "horovod", "--elastic"]).workers_join_running_job()


def test_a_run_config_json_is_read_back_as_a_config_file_and_its_engine_options_typed(tmp_path):
    """run_config.json holds every argument by its flag name (RunConfig.to_dict, the engines' options too): read back
    as --config it is the same configuration, each engine's options in its own section, read typed by its class."""
    from horovod_train.engines.ddp_options import DDPArguments
    from horovod_train.engines.fsdp_options import FSDPArguments

    given = ["--engine", "fsdp", "--fsdp_reshard_after_forward", "false", "--ddp_backend", "gloo", "--seed", "7"]
    config = parse_run_config(given)
    recorded = tmp_path / "run_config.json"
    recorded.write_text(json.dumps({**config.to_dict()}))
    again = parse_run_config(["--config", str(recorded)])
    assert again == config and again.to_dict() == config.to_dict()
    assert again.options(FSDPArguments).fsdp_reshard_after_forward is False
    assert again.options(DDPArguments).ddp_backend == "gloo" and again.training.seed == 7
