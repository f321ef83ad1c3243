"""Every argument of `train` and of the `bench` commands against its domain, in-process: a table of out-of-domain
values per argument (an argument added without an entry here, or without a domain in horovod_train/config/domains.py,
fails), a corpus of malformed config and data files, and checkpoint manifests that are not ours. Each refusal is a
UsageError (one line `error: ...; fix: ...`, exit 2, raised before anything is written:
tests/integration/test_bad_input.py runs the CLI on a few of them and checks that nothing was written)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from horovod_train.bench import BENCHMARKS, _module
from horovod_train.cli.main import build_parser
from horovod_train.common.errors import UsageError
from horovod_train.config import domains
from horovod_train.config.parsing import parse_run_config, sections
from horovod_train.config.run_config import DataArguments
from horovod_train.data.splits import load_raw_datasets
from horovod_train.outputs import checkpoint

FIELDS = [f.name for section in sections().values() for f in dataclasses.fields(section)]
LONG = "x" * 300  # one path component over NAME_MAX
# {file}: an existing regular file; {dir}: an existing directory; {long}: a 300-byte name.
BAD: dict[str, list[str]] = {
    "model_name_or_path": ["", "{long}"],
    "config_name": ["", "{dir}/{long}"],
    "tokenizer_name": [" ", "{long}"],
    "cache_dir": ["{file}", "{file}/sub", "/proc/hvt-cache", "{dir}/{long}"],
    "model_revision": [" ", "main\n"],
    "token": ["", "hf_\tx"],
    "trust_remote_code": ["maybe"],
    "attn_implementation": ["flash", "SDPA"],
    "use_peft": ["maybe"],
    "lora_r": ["0", "-8", "1.5", "100000"],
    "lora_alpha": ["0", "nan"],
    "lora_dropout": ["1", "-0.1", "nan"],
    "lora_target_modules": ["", "q\x01"],
    "task_name": ["glue", "sts-b"],
    "dataset_name": ["", "{long}"],
    "dataset_config_name": ["", "a\nb"],
    "train_file": ["{dir}/missing.csv", "{dir}/data.xlsx", "{dir}", "{dir}/{long}.csv"],
    "validation_file": ["{dir}/missing.csv", "{dir}"],
    "test_file": ["{dir}/missing.jsonl", "{dir}/test.txt"],
    "text_column_names": ["a,b,c", "a,", ""],
    "label_column_name": ["", " "],
    "validation_split_name": ["nope", ""],  # synthetic-nli has no named splits
    "validation_split_percentage": ["0", "100", "-5"],
    "max_seq_length": ["0", "-1"],
    "pad_to_max_length": ["maybe"],
    "overwrite_cache": ["2"],
    "max_train_samples": ["0", "-3"],
    "max_eval_samples": ["0"],
    "max_predict_samples": ["0", "-1"],
    "synthetic_num_examples": ["0", "1"],
    "num_labels": ["0", "-1"],
    "preprocessing_num_workers": ["0", "-2", "1.5"],
    "pad_to_multiple_of": ["0", "-8", "1.5"],
    "length_buckets": ["-1", "two"],
    "output_dir": ["", "{long}", "{dir}/{long}"],
    "overwrite_output_dir": ["sure"],
    "engine": ["mxnet", ""],
    "per_device_train_batch_size": ["0", "-1", "1.5"],
    "per_device_eval_batch_size": ["0"],
    "learning_rate": ["0", "-1", "nan", "inf", "fast"],
    "weight_decay": ["-1", "nan", "inf"],
    "adam_beta1": ["1", "-0.1", "nan"],
    "adam_beta2": ["1.5", "nan"],
    "adam_epsilon": ["-1", "nan", "inf"],
    "num_train_epochs": ["-1", "nan", "inf"],
    "max_steps": ["-2", "1e3"],
    "lr_scheduler_type": ["exponential"],
    "optim": ["adamw_hf", "sgd"],
    "warmup_ratio": ["-0.1", "1.5", "nan"],
    "warmup_steps": ["-1"],
    "gradient_accumulation_steps": ["0"],
    "max_grad_norm": ["-1", "nan", "inf"],
    "label_smoothing_factor": ["1", "-0.1", "nan"],
    "multi_label_threshold": ["0", "1", "-0.5", "nan"],
    "seed": ["-1", str(2**32)],
    "logging_steps": ["0", "2.5", "-0.5", "nan"],
    "eval_strategy": ["sometimes"],
    "eval_steps": ["0", "1.5", "inf"],
    "do_train": ["false"],
    "do_eval": ["false"],
    "do_predict": ["perhaps"],
    "use_cpu": ["perhaps"],
    "log_level": ["verbose"],
    "save_safetensors": ["false", "x"],
    "dropout": ["1", "-0.5", "nan"],
    "dataloader_num_workers": ["-1"],
    "disable_tqdm": ["x"],
    "report_to": ["neptune", "all,none"],
    "run_name": ["/abs/dir", "../escape", "a/../../b", "", "{long}"],
    "load_best_model_at_end": ["1.5"],
    "metric_for_best_model": [""],
    "greater_is_better": ["big"],
    "save_strategy": ["always"],
    "save_steps": ["-1", "3.5"],
    "save_total_limit": ["0", "-2"],
    "max_shard_size": ["5", "5 GiB", "GB", "0MB"],
    "resume_from_checkpoint": ["", "{long}"],
    "checkpoint_signals": ["SIGKILL", "SIGSTOP", "SIGCHLD", "SIGSEGV", "SIGNOPE", "TERM,TERM", ""],
    "ddp_timeout": ["0", "-5", "100000000000000", "1e14"],
    "audit_samples": ["y2"],
    "save_async": ["later"],
    "bf16": ["bfloat"],
    "fp16": ["half"],
    "tf32": ["tf"],
    "torch_compile": ["jit"],
    "torch_compile_backend": ["", "tensorrt", "Inductor"],
    "torch_compile_mode": ["fast", ""],
    "gradient_checkpointing": ["maybe"],
    "group_by_length": ["len"],
    "padding_free": ["flat"],
    "auto_find_batch_size": ["auto"],
    "scale_lr": ["x"],
    "compression": ["int8"],
    "op": ["max"],
    "gradient_predivide_factor": ["0", "-1", "nan", "inf"],
    "horovod_timeline": ["{file}/t.json", "{dir}", "/proc/hvt/t.json", "{dir}/{long}"],
    "autotune": ["x"],
    "autotune_log": ["{file}/a.csv", "{dir}"],
    "horovod_groups": ["-1"],
    "horovod_group_mb": ["0", "-1", "nan", "inf"],
    "elastic": ["x"],
    "elastic_commit_steps": ["0"],
    "ddp_bucket_cap_mb": ["0", "-25"],
    "ddp_backend": ["mpi"],
    "ddp_find_unused_parameters": ["x"],
    "fsdp_reshard_after_forward": ["x"],
    "fsdp_replicate_degree": ["-1", "x"],
}
NEEDS = {"autotune_log": ["--autotune"]}  # arguments whose domain is only reached with another one


@pytest.fixture
def places(tmp_path) -> dict[str, str]:
    (tmp_path / "a-file").write_text("x")
    return {"file": str(tmp_path / "a-file"), "dir": str(tmp_path), "long": LONG}


def test_every_argument_has_a_domain_and_out_of_domain_values():
    in_metadata = [
        f.name for section in sections().values() for f in dataclasses.fields(section) if "domain" in f.metadata
    ]
    assert sorted([*domains.DOMAINS, *in_metadata]) == sorted(FIELDS), (
        "give each new argument a domain: in horovod_train/config/domains.py, or an engine option's in its metadata"
    )
    assert sorted(BAD) == sorted(FIELDS), "add the new argument's out-of-domain values to BAD"
    assert all(BAD.values())


@pytest.mark.parametrize(("name", "value"), [(name, value) for name, values in BAD.items() for value in values])
def test_an_out_of_domain_argument_is_refused_in_one_line(name, value, places, tmp_path):
    argv = [*NEEDS.get(name, []), f"--{name}", value.format(**places)]
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(UsageError) as refused:
        parse_run_config(argv)
    message = str(refused.value)
    assert name in message and "; fix: " in message and "\n" not in message, message
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(
    ("name", "value"),
    [("learning_rate", ".nan"), ("num_train_epochs", ".inf"), ("seed", "-1"), ("ddp_timeout", "1.0e+14"),
     ("per_device_train_batch_size", "true"), ("output_dir", "{a: 1}"), ("run_name", "[a, b]"),
     ("warmup_ratio", "'nan'")],
)  # fmt: skip
def test_an_out_of_domain_value_in_a_config_file_is_refused(name, value, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text(f"{name}: {value}\n")
    with pytest.raises(UsageError, match=name):
        parse_run_config(["--config", str(config)])


@pytest.mark.parametrize(
    ("content", "suffix", "message"),
    [
        ("learning_rate: 1e-4\nrun_name: caf\xe9\n".encode("latin-1"), ".yaml", "is not UTF-8"),
        (b"1: 2\n", ".yaml", "not argument names: 1"),
        (b"[a, b]: 1\n", ".yaml", "malformed"),
        (b"? [a, b]\n: 1\n", ".yaml", "malformed"),
        (b"null\n", ".yaml", None),  # an empty config: the defaults
        (b"[1, 2]", ".json", "not a mapping"),
        (b"\xff\xfe{}", ".json", "is not UTF-8"),
    ],
)
def test_malformed_config_files_are_refused(content, suffix, message, tmp_path):
    config = tmp_path / f"job{suffix}"
    config.write_bytes(content)
    if message is None:
        assert parse_run_config(["--config", str(config)]).training.learning_rate == 5e-5
        return
    with pytest.raises(UsageError, match=message):
        parse_run_config(["--config", str(config)])


def test_a_config_that_is_a_directory_or_too_long_says_so(tmp_path):
    with pytest.raises(UsageError, match="is a directory"):
        parse_run_config(["--config", str(tmp_path)])
    with pytest.raises(UsageError, match="305-byte name"):
        parse_run_config(["--config", str(tmp_path / f"{LONG}.yaml")])


def test_an_argument_inside_its_domain_is_kept():
    config = parse_run_config(["--checkpoint_signals", "TERM,USR2,SIGINT", "--run_name", "exp/lr-1e-4",
                               "--seed", str(2**32 - 1), "--warmup_ratio", "1", "--max_steps", "-1",
                               "--ddp_timeout", "7200"])  # fmt: skip
    assert config.training.run_name == "exp/lr-1e-4" and config.training.seed == 2**32 - 1


# ---- data files -----------------------------------------------------------------------------------------------
def _frame(n: int = 12) -> pd.DataFrame:
    return pd.DataFrame({"premise": [f"a cat {i}" for i in range(n)], "hypothesis": [f"a dog {i}" for i in range(n)],
                         "label": [i % 3 for i in range(n)]})  # fmt: skip


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _rows(**changes: object) -> list[dict]:
    """The records of _frame(), row 5 (counted from 1) changed."""
    rows = _frame().to_dict("records")
    rows[4] = {**rows[4], **changes}
    return rows


MALFORMED_DATA = {
    "int in a text column": (lambda tmp: _jsonl(tmp / "t.jsonl", _rows(premise=5)), "row 5 column 'premise'"),
    "list in a text column": (
        lambda tmp: _jsonl(tmp / "t.jsonl", _rows(hypothesis=["a", "b"])),
        "row 5 column 'hypothesis'",
    ),
    "string in a label column": (lambda tmp: _jsonl(tmp / "t.jsonl", _rows(label="x")), "row 5 column 'label'"),
    "boolean in a label column": (lambda tmp: _jsonl(tmp / "t.jsonl", _rows(label=True)), "row 5 column 'label'"),
    "mapping in a label column": (lambda tmp: _jsonl(tmp / "t.jsonl", _rows(label={"id": 1})), "row 5 column 'label'"),
    "every text an int": (
        lambda tmp: _jsonl(tmp / "t.jsonl", [{**r, "premise": i} for i, r in enumerate(_rows())]),
        "non-text premise values (row 1 holds 0)",
    ),
    "a name among integer labels (csv)": (
        lambda tmp: (
            _frame().assign(label=["0", "1", "2", "1", "x", "2"] * 2).to_csv(tmp / "t.csv", index=False)
            or str(tmp / "t.csv")
        ),
        "row 5 holds 'x'",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED_DATA))
def test_a_data_file_with_mixed_types_names_file_row_and_column(case, tmp_path):
    make, expected = MALFORMED_DATA[case]
    path = make(tmp_path)
    with pytest.raises(UsageError) as refused:
        load_raw_datasets(DataArguments(train_file=path), seed=0)
    message = str(refused.value)
    assert path in message and expected in message and "\n" not in message, message


def test_a_test_file_with_a_bad_row_names_it(tmp_path):
    train = _jsonl(tmp_path / "train.jsonl", _rows())
    test = _jsonl(tmp_path / "test.jsonl", [{"premise": "p", "hypothesis": "h"}, {"premise": "p", "hypothesis": 3}])
    with pytest.raises(UsageError, match=r"--test_file .*test\.jsonl row 2 column 'hypothesis'"):
        load_raw_datasets(DataArguments(train_file=train, test_file=test), seed=0)


# ---- checkpoint manifests ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("manifest", ["[]", "{}", '{"model.safetensors": 1}', '"x"', "[1, 2]"])
def test_a_manifest_that_is_not_ours_is_one_line(manifest, tmp_path):
    ckpt = tmp_path / "checkpoint-5"
    ckpt.mkdir()
    (ckpt / checkpoint.MANIFEST).write_text(manifest)
    with pytest.raises(UsageError) as refused:
        checkpoint.verify_checkpoint(ckpt)
    assert "manifest.json" in str(refused.value) and "\n" not in str(refused.value)


# ---- bench ------------------------------------------------------------------------------------------------------
TRAIN_DESTS = set(FIELDS) | {"config", "debug", "engines", "help"}  # `bench train` takes train's arguments
TAKES_TRAIN_ARGS = ("train", "trace")
BENCH_BAD: dict[str, dict[str, list[str]]] = {
    "allreduce": {
        "output_dir": ["{file}/out", "{long}"], "min_bytes": ["0", "lots", "2B"], "max_bytes": ["1B", "-1MB"],
        "step_factor": ["1", "0"], "models": ["resnet"], "no_tensors": ["--no_tensors --models"],
        "frameworks": ["mxnet"], "iters": ["0"], "min_iters": ["0"], "budget": ["0", "nan"], "warmup": ["-1"],
        "label": ["a\nb"],
    },
    "allreduce-sweep": {
        "output_dir": ["{file}/out"], "np": ["0", "-2"], "variants": ["nccl"], "fusion_threshold_mb": ["-1", "nan"],
        "cycle_time_ms": ["-1", "inf"], "models": ["resnet"], "max_bytes": ["lots"], "repeats": ["0"],
        "bench_args": ["'unclosed"],
    },
    "train": {"world_sizes": ["0", "-1"], "repeats": ["0"], "model_size": ["gpt2"]},
    "trace": {"model_size": ["gpt2"], "skip_steps": ["-1", "10", "x"]},
    "project": {
        "output_dir": ["{file}/out"], "model": ["gpt"], "per_device_train_batch_size": ["0"],
        "compute_ms": ["0", "nan", "inf"], "samples_per_second_1gpu": ["0", "-1", "nan"],
        "compute_from": ["{dir}/none.json", "{file}"], "backward_fraction": ["0", "1.5", "nan"],
        "bytes_per_param": ["0", "3"], "gpus_per_node": ["0"], "intra_gbps": ["0", "inf"],
        "intra_latency_us": ["-1", "nan"], "inter_gbps": ["-1", "nan"], "inter_latency_us": ["inf"],
        "link_from": ["{dir}/none.json", "{file}"], "algorithm": ["tree"], "fusion_threshold_mb": ["0", "nan"],
        "cycle_time_ms": ["-1", "inf"], "ddp_bucket_cap_mb": ["0", "nan"], "no_overlap": ["--no_overlap x"],
        "max_gpus": ["0"], "check_published": ["--check_published x"], "lora_r": ["0", "-1", "1.5"],
        "engines": ["mxnet"], "fsdp_units": ["0", "1.5"],
    },
    "memory": {
        "output_dir": ["{file}/out", "{long}"], "overwrite_output_dir": ["--overwrite_output_dir x"],
        "architectures": ["gpt"], "modes": ["fp8"], "engines": ["dp", "mxnet"], "world_size": ["0"],
        "batch_sizes": ["0", "1 2 3"], "max_seq_length": ["0"], "max_steps": ["1"], "lora_r": ["0", "1.5"],
        "activation_seqs": ["0", "513"], "fit_batch": ["0"], "margin_gb": ["-1", "nan", "inf"],
        "no_runs": ["--no_runs x"], "bf16": ["x"],
    },
    "gpu": {
        "output_dir": ["{file}/out"], "model": ["gpt"], "tiny": ["--tiny x"], "bf16": ["maybe"],
        "fp16": ["maybe"], "per_device_train_batch_size": ["0"], "steps": ["0"], "warmup": ["-1"],
        "repeats": ["0"], "mean_length": ["nan", "0"], "min_length": ["0"], "max_seq_length": ["0", "513"],
        "group_by_length": ["--group_by_length x"], "torch_compile": ["--torch_compile x"],
        "peak_tflops": ["0", "nan", "inf"], "engines": ["mxnet"], "seed": ["-1", str(2**32)],
        "length_buckets": ["-1", "two"], "variants": ["fast"],
    },
}  # fmt: skip
# Arguments every bench command has that need no domain of their own.
BENCH_FREE = {"help", "benchmark", "command"}
FLAGS = {"no_tensors", "no_overlap", "check_published", "tiny", "group_by_length", "torch_compile", "no_runs",
         "overwrite_output_dir"}  # fmt: skip


def _bench_dests(name: str) -> set[str]:
    parser = argparse.ArgumentParser()
    _module(name).add_arguments(parser)
    return {action.dest for action in parser._actions} - BENCH_FREE


def test_every_bench_argument_has_out_of_domain_values():
    for name in BENCHMARKS:
        dests = _bench_dests(name) - (TRAIN_DESTS if name in TAKES_TRAIN_ARGS else set())
        assert sorted(BENCH_BAD[name]) == sorted(dests), f"bench {name}: add the new arguments to BENCH_BAD"


def _bench_argv(name: str, dest: str, value: str, places: dict[str, str]) -> list[str]:
    if dest in FLAGS:  # a flag: its value is a whole (bad) tail of arguments
        return ["bench", name, *value.format(**places).split()]
    return ["bench", name, f"--{dest}", value.format(**places)]


@pytest.mark.parametrize(
    ("name", "dest", "value"),
    [(name, dest, value) for name, table in BENCH_BAD.items() for dest, values in table.items() for value in values],
)
def test_an_out_of_domain_bench_argument_is_refused(name, dest, value, places, tmp_path):
    argv = _bench_argv(name, dest, value, places)
    if name in TAKES_TRAIN_ARGS:
        argv += ["--output_dir", str(tmp_path / "out")]
    with pytest.raises(UsageError) as refused:
        args = build_parser().parse_args(argv)
        _module(name).validate(args)
    assert "; fix: " in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "out").exists()


# The environment is input (issue 56): an out-of-domain value of every variable of domains.VARIABLES, and what the
# refusal says. Horovod read HOROVOD_FUSION_THRESHOLD=64MB as 64 bytes and HOROVOD_CYCLE_TIME=fast as 0, silently.
BAD_VARIABLES: dict[str, tuple[str, str]] = {
    "HOROVOD_FUSION_THRESHOLD": ("64MB", "is not a whole number of bytes (Horovod reads it as 64)"),
    "HOROVOD_CYCLE_TIME": ("fast", "is not a number of ms (Horovod reads it as 0)"),
    "HOROVOD_CACHE_CAPACITY": ("-1", "must be >= 0"),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("1m", "Horovod reads it as 1"),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("", "is empty"),
    "HOROVOD_STALL_CHECK_DISABLE": ("yes", "is not one of 0, 1"),
    "HOROVOD_AUTOTUNE": ("true", "is not one of 0, 1"),  # Horovod's strtol reads "true" as 0: off
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("on", "is not one of 0, 1"),
    "HOROVOD_HIERARCHICAL_ALLGATHER": ("2", "is not one of 0, 1"),
    "HOROVOD_TIMELINE_MARK_CYCLES": ("y", "is not one of 0, 1"),
    "HOROVOD_CPU_OPERATIONS": ("nccl", "is not one of gloo, mpi, ccl"),
    "HOROVOD_TRAIN_DEBUG": ("true", "is not one of 0, 1"),
    "HOROVOD_TRAIN_SPIN_WAIT": ("yes", "is not one of 0, 1"),
    "OMP_NUM_THREADS": ("0", "must be > 0"),
    "NCCL_DEBUG": ("verbose", "is not one of version, warn, info, trace, abort"),
    "NCCL_SOCKET_IFNAME": ("eth0 eth1", "holds a space"),
    "NCCL_IB_DISABLE": ("true", "is not one of 0, 1"),
    "NCCL_P2P_DISABLE": ("no", "is not one of 0, 1"),
    "MASTER_ADDR": ("", "is empty"),
    "MASTER_PORT": ("70000", "must be in 1..65535"),
    "RANK": ("first", "is not a whole number"),
    "WORLD_SIZE": ("0", "must be > 0"),
    "LOCAL_RANK": ("-1", "must be >= 0"),
    "LOCAL_WORLD_SIZE": ("two", "is not a whole number"),
}


def test_every_environment_variable_has_a_domain_and_an_out_of_domain_value():
    assert sorted(BAD_VARIABLES) == sorted(domains.VARIABLES), "add the new variable's out-of-domain value here"


@pytest.mark.parametrize("name", BAD_VARIABLES)
def test_an_out_of_domain_environment_variable_is_refused_in_one_line(name):
    value, says = BAD_VARIABLES[name]
    with pytest.raises(UsageError) as refused:
        domains.check_environment({name: value})
    message = str(refused.value)
    assert message.startswith(f"environment variable {name}={value!r} ") and says in message, message
    assert f"; fix: export {name}=" in message and f"unset {name}" in message and "\n" not in message
    domains.check_environment({name: domains.VARIABLES[name].example})  # the fix it names is in the domain


def test_a_rank_at_or_above_its_size_is_refused():
    with pytest.raises(UsageError, match="RANK=2 but WORLD_SIZE=2.*unset RANK WORLD_SIZE"):
        domains.check_environment({"RANK": "2", "WORLD_SIZE": "2"})
    domains.check_environment({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})


def test_train_doctor_and_bench_allreduce_refuse_a_bad_knob_before_starting(monkeypatch, tmp_path, capsys):
    """`bench allreduce` ended in a ValueError traceback; `train` ran with a 64-byte fusion buffer."""
    from horovod_train.cli import doctor
    from horovod_train.cli import main as cli

    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "64MB")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        cli.main(["train", "--engine", "horovod", "--output_dir", str(out)])
    assert exited.value.code == 2
    assert capsys.readouterr().err.startswith("error: environment variable HOROVOD_FUSION_THRESHOLD='64MB' ")
    with pytest.raises(UsageError, match="HOROVOD_FUSION_THRESHOLD='64MB'"):
        doctor.main(argparse.Namespace(engine="single"))
    with pytest.raises(UsageError, match="HOROVOD_FUSION_THRESHOLD='64MB'"):
        _module("allreduce").validate(build_parser().parse_args(["bench", "allreduce", "--output_dir", str(out)]))
    assert not out.exists()


def test_max_shard_size_takes_what_save_pretrained_parses():
    """The domain of --max_shard_size is the sizes above 0 that huggingface_hub parses (save_pretrained's split)."""
    from huggingface_hub.serialization._base import parse_size_to_int

    for value in ["5GB", "500mb", " 1.5 TB", "0.2KB", ".5GB", "5", "5 GiB", "GB", "0MB", "5G", "-1GB", "5XB"]:
        try:
            parsed = parse_size_to_int(value) > 0
        except ValueError:
            parsed = False
        size = domains.SHARD_SIZE.fullmatch(value)
        assert (size is not None and float(size.group(1)) > 0) == parsed, value
