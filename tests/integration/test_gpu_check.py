"""scripts/gpu_check.sh in its dry mode, for real (CPU, tiny sizes, no mocks): the steps run in order,
each one's status lands in the JSON report, and a failing step is named, exits non-zero and still
leaves the report. The CUDA-only steps are recorded as skipped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from support.jobs import BIN, REPO, base_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STATUSES = {"ok", "failed", "skipped"}


def gpu_check(cache_dir: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = base_env(cache_dir)
    env.update(PYTHON=str(BIN / "python"), HVT_GPU_CHECK_DRY="1")
    env.pop("OUT", None)
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def read_report(out: Path) -> dict:
    report = json.loads((out / "gpu_check.json").read_text())
    assert {"dry_run", "complete", "ok", "steps", "failed", "environment", "bench", "notes"} <= set(report)
    for step in report["steps"]:
        assert {"name", "what", "status", "seconds", "detail", "cmd"} <= set(step)
        assert step["status"] in STATUSES, step
    assert any("cannot test multi-GPU NCCL" in note for note in report["notes"])
    assert any("gradient all-reduce is NOT tested here" in note for note in report["notes"])
    assert any(note.startswith("Needs a node with 2+ GPUs") for note in report["notes"])
    assert report["gpu_path_verified"] is False
    return report


def test_dry_run_runs_every_step_that_needs_no_cuda(tmp_path, cache_dir):
    out = tmp_path / "out"
    proc = gpu_check(cache_dir, "--output_dir", str(out), "--work_dir", str(tmp_path / "work"))
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    report = read_report(out)
    assert report["dry_run"] and report["complete"] and report["ok"] and report["failed"] == []
    status = {s["name"]: s["status"] for s in report["steps"]}
    expected = ["deps", "horovod", "check_build", "environment", "doctor", "hvd_collectives", "bert_model"]
    expected += ["horovod_demo", "ddp_demo"]
    expected += ["bert_fp32", "bert_bf16", "bert_fp16", "bert_bf16_ddp", "dp_demo", "bench_b8"]
    assert list(status) == expected
    assert status["bert_fp16"] == "skipped"  # GradScaler fp16 needs CUDA
    assert all(status[name] == "ok" for name in expected if name != "bert_fp16"), status
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["environment"]["metrics"]["torch"] and steps["environment"]["metrics"]["gpus"] == []
    for name in ("horovod_demo", "ddp_demo", "bert_fp32", "bert_bf16", "bert_bf16_ddp", "dp_demo"):
        metrics = steps[name]["metrics"]
        assert metrics["last_loss"] < metrics["first_loss"] and 0 <= metrics["accuracy"] <= 1, (name, metrics)
        assert (out / "runs" / name / "metrics.jsonl").is_file() and Path(steps[name]["log"]).is_file()
    assert steps["ddp_demo"]["metrics"]["engine"] == "ddp" and steps["horovod_demo"]["metrics"]["engine"] == "horovod"
    collectives = steps["hvd_collectives"]["metrics"]  # on the CPU here: CUDA tensors on a GPU node
    assert sorted(collectives["ops"]) == ["float16", "float32", "float64", "int64", "uint8"]
    assert all(all(ops.values()) for ops in collectives["ops"].values()), collectives
    bench = steps["bench_b8"]["metrics"]
    assert bench["single"]["samples_per_second"] > 0 and bench["horovod"]["vs_single"] > 0
    assert report["bench"]["best"] == "bench_b8" and set(report["bench"]["met"]) == set(report["bench"]["targets"])
    assert "gpu-check" not in proc.stderr  # no failure line
    assert "step" in proc.stdout and "bench_b8" in proc.stdout  # the table
    assert "GPU path verified: no (one GPU cannot exercise" in proc.stdout


def test_a_failing_step_is_named_exits_non_zero_and_the_report_is_written(tmp_path, cache_dir):
    out = tmp_path / "out"
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_key: 1\n")
    proc = gpu_check(
        cache_dir, "--output_dir", str(out), "--steps", "environment,horovod_demo", "--demo_config", str(bad)
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu-check FAILED: horovod_demo" in proc.stderr
    report = read_report(out)
    assert report["complete"] and not report["ok"] and report["failed"] == ["horovod_demo"]
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert status == {"environment": "ok", "horovod_demo": "failed"}
    failed = report["steps"][1]
    assert "exit" in failed["detail"] and "no_such_key" in Path(failed["log"]).read_text()


def test_without_a_cuda_torch_it_refuses_in_one_line_unless_dry(tmp_path, cache_dir):
    env = base_env(cache_dir)
    env.update(PYTHON=str(BIN / "python"))
    env.pop("HVT_GPU_CHECK_DRY", None)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "fix:" in proc.stderr and not os.path.exists(REPO / ".venv-gpu")


def test_a_step_that_times_out_ends_its_whole_process_group(tmp_path):
    """A launcher killed on its own leaves its workers running (holding the GPU and the ports): a step's
    timeout ends every process the step started."""
    import argparse
    import time

    from horovod_train.gpucheck import check as gpu_check

    pid_file = tmp_path / "worker.pid"
    launcher = ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"]  # a launcher waiting on its worker
    ctx = gpu_check.Context(argparse.Namespace(), str(BIN / "python"), tmp_path, tmp_path, True, time.monotonic() + 60)
    step = gpu_check.Step("launcher", "a launcher and its worker", launcher, timeout_s=3)
    entry = gpu_check.run_step(ctx, step)
    assert entry["status"] == "failed" and entry["detail"] == "timeout 3s"
    worker = int(pid_file.read_text())
    for _ in range(50):  # reaped by init once killed
        if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        os.kill(worker, 9)
        raise AssertionError("the step's worker outlived its timeout")
