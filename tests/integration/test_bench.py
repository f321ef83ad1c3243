"""The benchmarks run on CPU in tiny configurations and write well-formed CSV/JSON/PNG (no speed asserts).
The bench commands that only launch (allreduce-sweep, train, trace) run inside the test process: their ranks
are real launches, the command itself pays no start-up. One sweep serves both all-reduce tests: its baseline
launch is `bench allreduce` under horovodrun."""

from __future__ import annotations

import csv
import json
import statistics
import subprocess
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, assert_ok, base_env, cli_here, run
from transformers import AutoConfig

from horovod_train.bench.communication.allreduce import COLUMNS as ALLREDUCE_COLUMNS
from horovod_train.bench.gpu.benchmark import COLUMNS as GPU_COLUMNS
from horovod_train.bench.runs.trace import COLUMNS as TRACE_COLUMNS
from horovod_train.bench.runs.train import COLUMNS as TRAIN_COLUMNS
from horovod_train.gpucheck.checks import check_bench
from horovod_train.gpucheck.runner import Step

BENCH = [str(BIN / "python"), "-m", "horovod_train", "bench"]
# A bench run inside this process: the test's limit is the launched bench's timeout it replaces (fixture included).
BENCH_TIMEOUT_S = 400

PNG = b"\x89PNG\r\n\x1a\n"

# tiny-bert's parameters in matmuls (MFU's N: not the embedding lookups), by hand: per layer (2) the query, key,
# value and attention output 4 x (128 x 128 + 128), two LayerNorms 2 x 256, the intermediate 128 x 256 + 256 and
# the output 256 x 128 + 128: 132,480; the pooler 128 x 128 + 128, the classifier 128 x 3 + 3, the embeddings'
# LayerNorm 256.
TINY_BERT_MATMUL_PARAMETERS = 2 * 132_480 + 16_512 + 387 + 256

TINY_JOB = [
    "--synthetic_num_examples", "400", "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "40",
    "--max_steps", "6", "--logging_steps", "3", "--disable_tqdm",
]  # fmt: skip


def bench_here(cache_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m horovod_train bench ARGS` run inside this process (support.jobs.cli_here): its launches are real
    processes, with the tests' environment (base_env) and the checkout as their working directory."""
    return cli_here(["bench", *args], base_env(cache_dir), cwd=REPO)


def median_logged_rate(run_dir: Path) -> float:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(line)["samples_per_second"] for line in lines if line)


def read_outputs(out: Path, stem: str, columns: list[str]) -> tuple[list[dict], dict]:
    with (out / f"{stem}.csv").open() as f:
        reader = csv.DictReader(f)
        assert reader.fieldnames == columns
        rows = list(reader)
    report = json.loads((out / f"{stem}.json").read_text())
    assert report["columns"] == columns and len(report["rows"]) == len(rows) > 0
    assert (out / f"{stem}.png").read_bytes()[:8] == PNG
    return rows, report


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache_dir) -> tuple[Path, subprocess.CompletedProcess]:
    """One allreduce-sweep over Gloo: two horovodrun -np 2 launches of `bench allreduce`, the baseline (single
    tensors up to 16KB and tiny-bert's gradients, Horovod and torch.distributed in the same ranks) and a fusion
    threshold of 0. Its output folder and what it printed."""
    out = tmp_path_factory.mktemp("sweep") / "sweep"
    cmd = ["allreduce-sweep", "--variants", "gloo", "--fusion_threshold_mb", "0", "--cycle_time_ms",
           "--models", "tiny-bert", "--max_bytes", "16KB", "--bench_args", "--iters 3 --budget 256KB",
           "--output_dir", str(out)]  # fmt: skip
    proc = bench_here(cache_dir, *cmd)
    assert_ok(proc)
    return out, proc


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_allreduce_horovod_and_torch_in_the_same_ranks(sweep):
    """The sweep's baseline launch is `bench allreduce` under horovodrun, its output folder a run's own."""
    out = sweep[0] / "runs" / "gloo-baseline-default"
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
    log = (sweep[0] / "logs" / "gloo-baseline-default.log").read_text().splitlines()
    ending = [line[line.index("==> ") :] for line in log if "==> " in line]  # the conclusion (rank 0's, prefixed)
    assert ending[0].startswith("==> Horovod/torch time, one tensor (>1: Horovod slower): 4KB "), ending
    assert "tiny-bert" in ending[1] and ending[2].startswith("==> largest gap: ") and ending[3].startswith("==> why: ")


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_allreduce_sweep_launches_one_run_per_setting(sweep):
    out, proc = sweep
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
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_bench_train_reports_scaling_and_the_horovod_ddp_ratio(tmp_path, cache_dir):
    out = tmp_path / "train"
    cmd = ["train", *TINY_JOB, "--world_sizes", "2", "--engines", "horovod-gloo,ddp-gloo",
           "--horovod_group_mb", "0.5", "--output_dir", str(out)]  # fmt: skip
    proc = bench_here(cache_dir, *cmd)
    assert_ok(proc)
    rows, report = read_outputs(out, "bench_train", TRAIN_COLUMNS)
    assert [(r["name"], r["world_size"]) for r in report["rows"]] == [
        ("single", 1),  # the baseline of the scaling efficiency is always run
        ("horovod-gloo", 2),
        ("ddp-gloo", 2),
    ]
    single, horovod, ddp = report["rows"]
    # Each run's speed from what its ranks logged (metrics.jsonl): the median over its logging intervals.
    rates = {
        name: median_logged_rate(out / f"{name}-r0") for name in ("single-np1", "horovod-gloo-np2", "ddp-gloo-np2")
    }
    assert [r["samples_per_second"] for r in report["rows"]] == pytest.approx(list(rates.values()))
    assert single["scaling_efficiency"] == pytest.approx(1.0)
    assert horovod["scaling_efficiency"] == pytest.approx(rates["horovod-gloo-np2"] / (2 * rates["single-np1"]))
    (ratio,) = report["ratios"]
    assert ratio["samples_per_second_ratio"] == pytest.approx(rates["horovod-gloo-np2"] / rates["ddp-gloo-np2"])
    assert "==> Horovod/DDP samples/s at np=2:" in proc.stdout
    assert "==> horovod-gloo np=2 / single np=1 samples/s:" in proc.stdout
    # --horovod_group_mb reaches Horovod's ranks: tiny-bert's 2.2 MB of gradients in buckets of 0.5 MiB. By hand,
    # in backward order, each bucket filled while the next gradient fits in 524,288 bytes: the classifier, the
    # pooler and layer 1 down to its value projection (465,932 bytes); layer 1's key and query and layer 0 down
    # to its value projection's (463,872); the rest of layer 0 and the embeddings but the words' (330,752); the
    # word embeddings (vocabulary x 128 x 4 bytes) join the third bucket only if they fit.
    run_dir = out / "horovod-gloo-np2-r0"
    words = AutoConfig.from_pretrained(run_dir).vocab_size * 128 * 4
    expected = 3 if 330_752 + words <= 2**19 else 4
    assert json.loads((run_dir / "all_results.json").read_text())["gradient_groups"] == expected


@pytest.mark.slow
@pytest.mark.timeout(BENCH_TIMEOUT_S)
def test_bench_trace_splits_each_engines_step_from_real_traces(tmp_path, cache_dir):
    out = tmp_path / "trace"
    cmd = ["trace", "--model_size", "demo", *TINY_JOB, "--engines", "horovod-gloo,ddp-gloo",
           "--output_dir", str(out)]  # fmt: skip
    proc = bench_here(cache_dir, *cmd)
    assert_ok(proc)
    with (out / "bench_trace.csv").open() as f:
        assert csv.DictReader(f).fieldnames == TRACE_COLUMNS
    report = json.loads((out / "bench_trace.json").read_text())
    assert [r["name"] for r in report["rows"]] == ["single", "horovod-gloo", "ddp-gloo"]
    single, horovod, ddp = report["rows"]
    for r in report["rows"]:
        assert r["steps"] == 6 - 2  # --skip_steps 2
        assert r["samples_per_second"] > 0 and r["step"] > 0
        assert r["forward"] > 0 and r["backward"] > 0 and r["optimizer"] > 0 and r["other"] >= 0
        parts = r["forward"] + r["backward"] + r["gradient_wait"] + r["optimizer"]
        assert parts + r["other"] == pytest.approx(r["step"], rel=1e-9)  # the parts add up to the step
    # Only Horovod waits for its gradients before the optimizer (DDP inside backward).
    assert horovod["gradient_wait"] > 0 and ddp["gradient_wait"] == 0 == single["gradient_wait"]
    # Horovod's second run: rank 0's timeline splits the all-reduce, every part inside it.
    assert horovod["timeline_samples_per_second"] > 0 and horovod["transfer"] > 0 and horovod["negotiate"] > 0
    assert horovod["allreduce"] >= max(horovod[p] for p in ("transfer", "memcpy_in", "memcpy_out"))
    for r in (single, ddp):
        assert all(r[p] != r[p] for p in ("timeline_samples_per_second", "allreduce", "transfer"))  # NaN
    for name, ranks in (
        ("single-np1", 1),
        ("horovod-gloo-np2", 2),
        ("horovod-gloo-np2-timeline", 2),
        ("ddp-gloo-np2", 2),
    ):
        assert {p.name for p in (out / f"{name}-trace").glob("*.json")} == {
            *(f"rank{r}.steps.json" for r in range(ranks)),
            *(["timeline.json"] if name.endswith("-timeline") else []),
        }
    assert "copy in" in proc.stdout


def test_bench_gpu_runs_tiny_on_cpu(tmp_path, cache_dir):
    out = tmp_path / "gpu"
    args = ["gpu", "--tiny", "--repeats", "2", "--peak_tflops", "989", "--output_dir", str(out)]
    proc = run([*BENCH, *args, "--variants", "bucketed", "padding_free", "--length_buckets", "2"], cache_dir,
               timeout=300)  # fmt: skip
    assert_ok(proc)
    rows, report = read_outputs(out, "gpu", GPU_COLUMNS)
    expected = [("single", "eager"), ("horovod", "eager"), ("single", "bucketed")]
    assert [(r["engine"], r["variant"]) for r in rows] == expected and report["tiny"] is True
    # padding_free: a decoder's; on BERT a row of the table says so, and nothing is timed.
    (skipped,) = report["skipped"]
    assert skipped["variant"] == "padding_free" and skipped["skipped"].startswith("skipped: tiny-bert is an encoder")
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("single") and "padding_free" in line]
    assert line.endswith(skipped["skipped"]) and " - " in line
    # The bucketed step trains on the same examples, padded to at most two lengths; nothing is compiled.
    windows = {(w["engine"], w["repeat"]): w for w in report["raw"]}
    for repeat in range(2):
        eager, bucketed = windows["single", repeat], windows["single/bucketed", repeat]
        assert bucketed["tokens"] == eager["tokens"] and bucketed["padded_tokens"] >= eager["padded_tokens"]
    assert [r["graphs"] for r in report["rows"]] == [0, 0, 0]
    # The GPU check's reading of it (bench_shapes_b256 runs this command with the compiled variants).
    detail, metrics = check_bench(None, Step("bench_shapes", "", None, 1.0, run_dir=out), proc.stdout)
    assert metrics["single/bucketed"]["padded_tokens_per_second"] > 0 and "; bucketed " in detail
    for r in report["rows"]:
        assert r["samples_per_second"] > 0 and r["model"] == "tiny-bert" and r["precision"] == "bf16"
        # The rates of the engine's median window (by samples/s), from its measured windows.
        key = r["engine"] if r["variant"] == "eager" else f"{r['engine']}/{r['variant']}"
        windows = sorted((w["samples"] / w["seconds"], w["tokens"] / w["seconds"]) for w in report["raw"]
                         if w["engine"] == key)  # fmt: skip
        median = windows[(len(windows) - 1) // 2]
        assert (r["samples_per_second"], r["tokens_per_second"]) == pytest.approx(median)
        assert r["parameters"] == TINY_BERT_MATMUL_PARAMETERS
        assert r["mfu"] == pytest.approx(6 * TINY_BERT_MATMUL_PARAMETERS * median[1] / 989e12)
        assert r["peak_tflops"] == 989
    assert "==> horovod np=1 / plain samples/s:" in proc.stdout


def test_the_bench_property_tests_write_nothing_in_the_working_directory(tmp_path):
    """Hypothesis writes its example database and constants cache under .hypothesis/ of the directory pytest
    runs in (the checkout): the suite sends them to its temporary directory."""
    tests = [
        REPO / "tests/unit/test_bench_trace.py::test_union_of_intervals_is_the_covered_length",
        REPO / "tests/unit/test_bench.py::test_gradient_buckets_are_greedy_capped_runs_in_backward_order",
    ]
    cmd = [str(BIN / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(REPO),
           "-c", str(REPO / "pyproject.toml"), *map(str, tests)]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "2 passed" in proc.stdout and not (tmp_path / ".hypothesis").exists()
