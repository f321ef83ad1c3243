"""The benchmarks run on CPU in tiny configurations and write well-formed CSV/JSON/PNG (no speed asserts)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import BIN, assert_ok, run, train_cmd

from horovod_train.bench.allreduce import COLUMNS as ALLREDUCE_COLUMNS
from horovod_train.bench.gpu import COLUMNS as GPU_COLUMNS
from horovod_train.bench.train import COLUMNS as TRAIN_COLUMNS
from horovod_train.cli import main
from horovod_train.config import HorovodArguments

BENCH = [str(BIN / "python"), "-m", "horovod_train", "bench"]
PNG = b"\x89PNG\r\n\x1a\n"
TINY_ALLREDUCE = ["--max_bytes", "16KB", "--models", "tiny-bert", "--iters", "3", "--budget", "256KB"]
TINY_JOB = [
    "--synthetic_num_examples", "400", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "40",
    "--max_steps", "6", "--logging_steps", "3", "--disable_tqdm",
]  # fmt: skip


def read_outputs(out: Path, stem: str, columns: list[str]) -> tuple[list[dict], dict]:
    with (out / f"{stem}.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == columns
        rows = list(reader)
    report = json.loads((out / f"{stem}.json").read_text())
    assert report["columns"] == columns and len(report["rows"]) == len(rows) > 0
    assert (out / f"{stem}.png").read_bytes()[:8] == PNG
    return rows, report


@pytest.mark.slow
def test_allreduce_horovod_and_torch_in_the_same_ranks(tmp_path, cache_dir):
    out = tmp_path / "allreduce"
    cmd = [
        str(BIN / "horovodrun"),
        "-np",
        "2",
        "--gloo",
        *BENCH,
        "allreduce",
        *TINY_ALLREDUCE,
        "--output_dir",
        str(out),
    ]
    proc = run(cmd, cache_dir, timeout=300)
    assert_ok(proc)
    rows, report = read_outputs(out, "allreduce", ALLREDUCE_COLUMNS)
    cases = {(r["framework"], r["case"], r["mode"]) for r in report["rows"]}
    sizes = {"4KB", "8KB", "16KB"}
    assert cases == {
        *(("horovod", s, "single") for s in sizes),
        *(("torch", s, "single") for s in sizes),
        ("horovod", "tiny-bert", "async"),
        ("horovod", "tiny-bert", "one_by_one"),
        ("torch", "tiny-bert", "async"),
        ("torch", "tiny-bert", "bucketed"),
    }
    for r in rows:  # nccl-tests' definitions, checked from the CSV itself
        n, nbytes, seconds = int(r["world_size"]), int(r["bytes"]), float(r["time_us"]) / 1e6
        assert n == 2 and seconds > 0
        assert float(r["algbw_GBps"]) == pytest.approx(nbytes / seconds / 1e9, rel=1e-3, abs=1e-6)
        assert float(r["busbw_GBps"]) == pytest.approx(float(r["algbw_GBps"]) * 2 * (n - 1) / n, rel=1e-6, abs=1e-6)
    tiny = next(r for r in report["rows"] if r["case"] == "tiny-bert")
    assert tiny["tensors"] == 41 and tiny["bytes"] > 2_000_000
    horovod = next(r for r in report["rows"] if r["framework"] == "horovod")
    assert horovod["controller"] == "gloo" and horovod["fusion_threshold"] == 128 * 2**20


@pytest.mark.slow
def test_allreduce_sweep_launches_one_run_per_setting(tmp_path, cache_dir):
    out = tmp_path / "sweep"
    cmd = [*BENCH, "allreduce-sweep", "--variants", "gloo", "--fusion_threshold_mb", "0", "--cycle_time_ms",
           "--models", "tiny-bert", "--max_bytes", "8KB", "--bench_args", "--iters 2 --budget 64KB",
           "--output_dir", str(out)]  # fmt: skip
    proc = run(cmd, cache_dir, timeout=400)
    assert_ok(proc)
    _, report = read_outputs(out, "sweep", ["variant", "setting", "value", *ALLREDUCE_COLUMNS])
    unfused = [r for r in report["rows"] if r["setting"] == "fusion_threshold_mb"]
    assert {(r["framework"], r["mode"], r["fusion_threshold"]) for r in unfused} == {
        ("horovod", "async", 0),
        ("horovod", "one_by_one", 0),
    }
    baseline = [r for r in report["rows"] if r["setting"] == "baseline"]
    assert {r["framework"] for r in baseline} == {"horovod", "torch"}
    assert {r["cycle_time_ms"] for r in baseline if r["framework"] == "horovod"} == {1.0}
    assert "fusion_threshold_mb" in proc.stdout and (out / "logs").is_dir()


@pytest.mark.slow
def test_bench_train_reports_scaling_and_the_horovod_ddp_ratio(tmp_path, cache_dir):
    out = tmp_path / "train"
    cmd = [*BENCH, "train", *TINY_JOB, "--world_sizes", "2", "--engines", "horovod-gloo,ddp-gloo",
           "--output_dir", str(out)]  # fmt: skip
    proc = run(cmd, cache_dir, timeout=400)
    assert_ok(proc)
    rows, report = read_outputs(out, "bench_train", TRAIN_COLUMNS)
    assert [(r["name"], r["world_size"]) for r in report["rows"]] == [
        ("single", 1),  # the baseline of the scaling efficiency is always run
        ("horovod-gloo", 2),
        ("ddp-gloo", 2),
    ]
    single, horovod, ddp = report["rows"]
    assert single["scaling_efficiency"] == pytest.approx(1.0)
    assert horovod["scaling_efficiency"] == pytest.approx(
        horovod["samples_per_second"] / (2 * single["samples_per_second"])
    )
    (ratio,) = report["ratios"]
    assert ratio["samples_per_second_ratio"] == pytest.approx(horovod["samples_per_second"] / ddp["samples_per_second"])
    assert "==> Horovod/DDP samples/s at np=2:" in proc.stdout


def test_bench_gpu_runs_tiny_on_cpu(tmp_path, cache_dir):
    out = tmp_path / "gpu"
    args = ["gpu", "--tiny", "--repeats", "2", "--peak_tflops", "989", "--output_dir", str(out)]
    proc = run([*BENCH, *args], cache_dir, timeout=300)
    assert_ok(proc)
    rows, report = read_outputs(out, "gpu", GPU_COLUMNS)
    assert [r["engine"] for r in rows] == ["single", "horovod"] and report["tiny"] is True
    for r in report["rows"]:
        assert r["samples_per_second"] > 0 and r["model"] == "tiny-bert" and r["precision"] == "bf16"
        tokens_per_s = r["tokens_per_second"]
        assert r["mfu"] == pytest.approx(6 * r["parameters"] * tokens_per_s / 989e12) and r["peak_tflops"] == 989
    assert "==> horovod np=1 / plain samples/s:" in proc.stdout


def test_mfu_counts_bert_base_without_its_embeddings():
    """bench gpu's FLOPs per token: BERT-base has 108.3 M parameters, 22.7 M of them in embeddings
    (lookups: no matmul FLOPs); counting them made MFU about 26 % too high. Built on the meta device
    (no memory, no weights)."""
    from transformers import BertForSequenceClassification

    from horovod_train.bench.common import bert_config
    from horovod_train.bench.gpu import flop_parameters

    with torch.device("meta"):
        model = BertForSequenceClassification(bert_config("bert-base-cased"))
    total = sum(p.numel() for p in model.parameters())
    embeddings = sum(p.numel() for p in model.bert.embeddings.parameters())
    embeddings -= sum(p.numel() for p in model.bert.embeddings.LayerNorm.parameters())  # a LayerNorm, not a lookup
    assert round(total / 1e6, 1) == 108.3 and round(embeddings / 1e6, 1) == 22.7
    assert flop_parameters(model) == total - embeddings
    assert total / flop_parameters(model) == pytest.approx(1.265, abs=0.005)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H100 NVL", 835.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA L40S", 362.0),
        ("Tesla V100-SXM2-32GB", None),  # no bf16 tensor cores: no MFU rather than a wrong one
    ],
)
def test_the_peak_for_mfu_comes_from_the_devices_name(name, peak):
    from horovod_train.bench.gpu import peak_bf16_tflops

    assert peak_bf16_tflops(name) == peak


@pytest.mark.slow
def test_train_timeline_and_autotune_flags(tmp_path, cache_dir):
    out, timeline = tmp_path / "run", tmp_path / "tl" / "timeline.json"
    train = train_cmd(*TINY_JOB, "--horovod_timeline", str(timeline), "--autotune", "--output_dir", str(out))
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--gloo", *train]
    proc = run(cmd, cache_dir, timeout=300)
    assert_ok(proc)
    text = timeline.read_text()
    assert "NEGOTIATE_ALLREDUCE" in text and "ALLREDUCE" in text
    config = json.loads((out / "run_config.json").read_text())
    assert config["horovod_env"]["HOROVOD_TIMELINE"] == str(timeline)
    assert config["horovod_env"]["HOROVOD_AUTOTUNE"] == "1"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["allreduce", "--max_bytes", "12XB"], "cannot read '12XB' as a size"),
        (["allreduce", "--min_bytes", "1MB", "--max_bytes", "4KB"], "are empty"),
        (["train", "--repeats", "0"], "--repeats must be >= 1"),
        (["train", "--engine", "ddp"], "--engine does not apply"),
        (["gpu", "--per_device_train_batch_size", "0"], "bad benchmark sizes"),
        (["gpu", "--bf16", "--fp16"], "--bf16 and --fp16 are both set"),
        (["gpu", "--mean_length", "500"], "bad benchmark sizes"),
    ],
)
def test_bench_bad_input_is_one_line(args, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args, "--output_dir", str(tmp_path / "never")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "never").exists()


def test_horovod_cpu_defaults_apply_only_where_unset(monkeypatch, tmp_path):
    from horovod_train.engines.horovod import env as horovod_env

    stall = ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    for name in (*horovod_env.CPU_DEFAULTS, *stall, "HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    yield_var = "OMPI_MCA_mpi_yield_when_idle"  # Open MPI's parameter names are lower case
    args = HorovodArguments(horovod_timeline=str(tmp_path / "t" / "timeline.json"), autotune=True)
    applied = horovod_env.apply(args, cuda=False)
    assert applied[yield_var] == "1" == os.environ[yield_var]
    assert applied["HOROVOD_TIMELINE"] == str(tmp_path / "t" / "timeline.json") and (tmp_path / "t").is_dir()
    assert applied["HOROVOD_AUTOTUNE"] == "1"
    assert applied["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "1800"  # --ddp_timeout's default
    monkeypatch.delenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS")
    assert horovod_env.apply(args, cuda=False, timeout_s=7200)["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "7200"
    monkeypatch.setenv(yield_var, "0")  # the user's own setting wins
    assert yield_var not in horovod_env.apply(HorovodArguments(), cuda=False)
    assert os.environ[yield_var] == "0"
    monkeypatch.delenv(yield_var)
    assert yield_var not in horovod_env.apply(HorovodArguments(), cuda=True)


@pytest.mark.parametrize(
    ("groups", "cuda", "elastic", "expected"),
    [(None, False, False, 1), (None, True, False, None), (None, False, True, None), (0, False, False, None),
     (3, True, False, 3)],
)  # fmt: skip
def test_gradient_groups_default_to_one_fused_all_reduce_on_cpu(groups, cuda, elastic, expected):
    from horovod_train.engines.horovod import env as horovod_env

    args = HorovodArguments(horovod_groups=groups, elastic=elastic)
    assert horovod_env.optimizer_groups(args, cuda=cuda) == expected
