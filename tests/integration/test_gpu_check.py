"""scripts/gpu_check.sh for real on the CPU (tiny sizes, no mocks): the one command docs/performance.md gives for a
lent GPU machine, run dry: its plan fits 8 minutes, every step that needs no CUDA runs (two ranks on one device
end with the single process's parameters through Horovod's and DDP's real gradient paths) or, where it is another
step but for its engine, is read by the train command's parser, and what it leaves in $OUT can come back from such
a machine. A failing step is named and still leaves the report; SIGTERM or a
step's timeout ends every process the step started, those its launcher put in sessions of their own too."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from support.jobs import BIN, REPO, base_env

SCRIPT = REPO / "scripts" / "gpu_check.sh"
STATUSES = {"ok", "failed", "skipped"}
EIGHT_MINUTES = 480
BACK = re.compile(r"[A-Za-z0-9._-]+")  # the names a lent machine sends back
# The dry plan in two runs of the documented command, each within its timeout, and the steps parsed instead of run:
# together every step. zero1_demo and fsdp_demo are ddp_demo but for --engine (the same launcher, job and check):
# the train command's parser reads them here, ddp_demo runs; each ran on a GPU (docs/performance.md), and each engine
# trains under torchrun in test_engine_equivalence.py.
SETUP_AND_TWO_RANKS = "nvidia_smi,environment,deps,builds,hvd_collectives,bench_b8,equiv_single,equiv_horovod,equiv_ddp"
TRAINING = "bert_config,bert_fp16,ddp_demo,horovod_demo,bert_bf16_ddp,dp_demo,doctor"
PARSED = "zero1_demo,fsdp_demo"


def dry_env(cache_dir: Path, out: Path) -> dict[str, str]:
    env = base_env(cache_dir)
    env.update(PYTHON=str(BIN / "python"), HVT_GPU_CHECK_DRY="1", OUT=str(out))
    env.pop("HVT_WHEELS", None)
    return env


def gpu_check(cache_dir: Path, out: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=dry_env(cache_dir, out), capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def documented_command() -> list[str]:
    """The `run` command docs/performance.md gives the next GPU session (the block after its marker line)."""
    text = (REPO / "docs" / "performance.md").read_text()
    block = text.split("<!-- the GPU check's command -->", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return shlex.split(block.strip())


def read_report(folder: Path) -> dict:
    report = json.loads((folder / "gpu_check.json").read_text())
    for step in report["steps"]:
        assert {"name", "what", "status", "seconds", "detail", "cmd", "estimate_s"} <= set(step)
        assert step["status"] in STATUSES, step
    assert report["gpu_path_verified"] is False
    from horovod_train.gpucheck.report import NEEDS_TWO_GPUS

    states = {p["path"]: p["state"] for p in report["paths"]}
    assert {path for path, state in states.items() if state == "needs 2+ GPUs"} == set(NEEDS_TWO_GPUS)
    assert any("ZeRO-1" in path for path in NEEDS_TWO_GPUS)  # the sharded engines' collectives between GPUs
    return report


def assert_it_can_come_back(folder: Path) -> None:
    """At most 8 files, 16 MiB each, right in the folder, with names a lent machine sends back."""
    files = list(folder.iterdir())
    assert len(files) <= 8 and all(f.is_file() and BACK.fullmatch(f.name) for f in files), files
    assert all(f.stat().st_size < 16 * 2**20 for f in files)


def documented_args() -> list[str]:
    """The documented command's arguments to scripts/gpu_check.sh (its environment is the bundle's folder)."""
    command = documented_command()
    env_words = [w for w in command if re.fullmatch(r"[A-Z_]+=.*", w)]
    assert command[len(env_words) :][:2] == ["bash", "scripts/gpu_check.sh"] and "--budget_s" in command
    return command[len(env_words) + 2 :]


def planned_seconds(stdout: str) -> tuple[float, float]:
    found = re.search(r"budget (\d+)s, (\d+)s planned within it", stdout)
    assert found, stdout[-2000:]
    return float(found[1]), float(found[2])


def test_the_documented_command_plans_within_its_budget_and_the_default_within_8_minutes(tmp_path, cache_dir):
    args = documented_args()
    proc = gpu_check(cache_dir, tmp_path / "OUT", *args, "--plan-only", timeout=120)
    assert proc.returncode == 0, proc.stderr
    budget, planned = planned_seconds(proc.stdout)
    assert budget == float(args[args.index("--budget_s") + 1]) and 0 < planned <= budget
    default = gpu_check(cache_dir, tmp_path / "OUT", "--plan-only", timeout=120)
    assert planned_seconds(default.stdout)[0] == EIGHT_MINUTES and planned_seconds(default.stdout)[1] <= EIGHT_MINUTES
    lines = proc.stdout.splitlines()
    first = [line.split()[0] for line in lines[lines.index(next(x for x in lines if x.startswith("step "))) + 1 :]]
    assert first[:4] == ["nvidia_smi", "environment", "deps", "builds"]  # the facts before anything can fail
    assert not (tmp_path / "OUT" / "gpu_check" / "gpu_check.json").exists()  # a plan, nothing run


# The check itself, planning both its plans in a python given none of its site-packages (the node's, before the deps).
ON_THE_STANDARD_LIBRARY = """
import importlib.util, sys
assert importlib.util.find_spec("torch") is None  # the premise: no torch here
from horovod_train.gpucheck.check import main
code = main(sys.argv[1:])
print("outside:", sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - {"horovod_train"}))
sys.exit(code)
"""


def test_the_check_plans_on_a_python_with_only_its_standard_library(tmp_path):
    """It starts before the node's dependencies are installed: a python without site-packages (-S: no torch, no
    transformers) builds the dry plan and the node's, reading the engine rows and the run directory's names, and
    imports nothing but the standard library and horovod_train (the layout test reads the same from the source)."""
    from horovod_train.engines.specs import ENGINES

    cmd = [str(BIN / "python"), "-S", "-c", ON_THE_STANDARD_LIBRARY, "--plan_only", "--dry_run", "--scripts_dir",
           "scripts", "--output_dir", str(tmp_path / "out"), "--work_dir", str(tmp_path / "work")]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "outside: ['__main__']", lines[-1]
    planned = {line.split()[0] for line in lines[2:-1]}
    assert {f"{name}_demo" for name, spec in ENGINES.items() if spec.gpu_demo} <= planned, proc.stdout


def dry_plan(monkeypatch) -> dict:
    import argparse

    from horovod_train.gpucheck import check, steps

    monkeypatch.delenv("HVT_WHEELS", raising=False)
    parser = argparse.ArgumentParser()
    check.add_arguments(parser)
    ctx = check.make_context(parser.parse_args(["--dry_run", "--scripts_dir", str(REPO / "scripts")]))
    return {step.name: step for step in steps.plan(ctx)}


def test_the_two_dry_runs_below_and_the_parsed_steps_cover_every_step_of_the_dry_plan(monkeypatch):
    covered = [*SETUP_AND_TWO_RANKS.split(","), *TRAINING.split(","), *PARSED.split(",")]
    assert sorted(dry_plan(monkeypatch)) == sorted(covered) and len(set(covered)) == len(covered)


def test_the_parsed_steps_are_ddp_demo_but_for_their_engine_and_the_train_parser_takes_them(monkeypatch):
    from horovod_train.config.parsing import parse_run_config

    monkeypatch.chdir(REPO)  # the demo config's path, as the check runs from the checkout
    plan = dry_plan(monkeypatch)
    launched = plan["ddp_demo"]
    for name in PARSED.split(","):
        step, engine = plan[name], name.removesuffix("_demo")
        expected = [word.replace("ddp_demo", name) for word in launched.cmd]
        expected[expected.index("--engine") + 1] = engine
        assert step.cmd == expected, (name, step.cmd)
        assert (step.check, step.after, step.env, step.needs_cuda) == (
            launched.check, launched.after, launched.env, launched.needs_cuda
        )  # fmt: skip
        assert parse_run_config(step.cmd[step.cmd.index("train") + 1 :]).training.engine == engine


def run_documented_dry(tmp_path: Path, cache_dir: Path, steps: str) -> tuple[dict, Path, str]:
    # Up to nine steps, each a Python start or a launch: 2 minutes on a quiet machine, beside the other tiers more.
    proc = gpu_check(cache_dir, tmp_path / "OUT", *documented_args(), "--dry-run", "--steps", steps, timeout=420)
    assert proc.returncode == 0, f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    folder = tmp_path / "OUT" / "gpu_check"
    assert_it_can_come_back(folder)
    report = read_report(folder)
    assert report["dry_run"] and report["complete"] and report["ok"] and report["failed"] == []
    assert "gpu-check" not in proc.stderr and "GPU path verified: no" in proc.stdout
    return report, folder, proc.stdout


def test_the_documented_command_run_dry_builds_and_runs_two_ranks_on_one_device(tmp_path, cache_dir):
    """Horovod's and DDP's real gradient paths with two ranks on one device (the CPU here, the GPU on the node)
    end with the single process's parameters; NCCL's collectives (Gloo here) and the bench run too."""
    report, folder, _ = run_documented_dry(tmp_path, cache_dir, SETUP_AND_TWO_RANKS)
    status = {s["name"]: s["status"] for s in report["steps"]}
    expected = ["nvidia_smi", "environment", "deps", "builds", "horovod", "horovod_gloo", "hvd_collectives"]
    assert list(status) == [*expected, "bench_b8", "equiv_single", "equiv_horovod", "equiv_ddp"]
    assert status.pop("nvidia_smi") == "skipped" and set(status.values()) == {"ok"}  # nvidia-smi: CUDA only
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["environment"]["metrics"]["torch"] and steps["environment"]["metrics"]["gpus"] == []
    for name, engine in (("equiv_horovod", "horovod"), ("equiv_ddp", "ddp")):
        metrics = steps[name]["metrics"]
        assert metrics["engine"] == engine and metrics["world_size"] == 2 and metrics["device"] == "cpu", metrics
        assert 0 < metrics["max_abs_difference"] <= 1e-5  # averaged, not identical: the ranks saw half a batch each
    assert steps["equiv_ddp"]["metrics"]["backend"] == "gloo"
    collectives = steps["hvd_collectives"]["metrics"]
    assert sorted(collectives["ops"]) == ["float16", "float32", "float64", "int64", "uint8"]
    assert all(all(ops.values()) for ops in collectives["ops"].values()), collectives
    assert steps["bench_b8"]["metrics"]["single"]["samples_per_second"] > 0 and report["bench"]["best"] == "bench_b8"
    states = {p["steps"]: p["state"] for p in report["paths"]}
    assert states["equiv_horovod"] == states["equiv_ddp"] == "ran on the CPU (dry run)"
    assert_details(folder, report, ["equiv_single", "equiv_horovod", "equiv_ddp"])
    with tarfile.open(folder / "details.tar.gz") as tar:
        assert "details/bench/bench_b8/gpu.json" in tar.getnames()


def test_the_documented_command_run_dry_trains_under_each_launcher(tmp_path, cache_dir):
    report, folder, _ = run_documented_dry(tmp_path, cache_dir, TRAINING)
    status = {s["name"]: s["status"] for s in report["steps"]}
    assert list(status) == TRAINING.split(",")
    skipped = {"bert_fp16", "bert_config"}  # fp16's GradScaler needs CUDA; a dry run's BERT is tiny-bert
    assert {n for n, s in status.items() if s == "skipped"} == skipped and set(status.values()) == {"ok", "skipped"}
    steps = {s["name"]: s for s in report["steps"]}
    trained = ["ddp_demo", "horovod_demo", "bert_bf16_ddp", "dp_demo"]
    for name in trained:
        metrics = steps[name]["metrics"]
        assert metrics["last_loss"] < metrics["first_loss"] and metrics["device"] == "cpu", (name, metrics)
    assert {steps[name]["metrics"]["engine"] for name in trained} == {"ddp", "horovod", "dp"}
    assert_details(folder, report, trained)


def assert_details(folder: Path, report: dict, runs: list[str]) -> None:
    """Each run's log and metrics in details.tar.gz; every step's output in gpu_check.log as it went."""
    with tarfile.open(folder / "details.tar.gz") as tar:
        names = set(tar.getnames())
    for name in runs:
        assert {f"details/logs/{name}.log", f"details/runs/{name}/metrics.jsonl"} <= names
    log = (folder / "gpu_check.log").read_text()
    assert all(f"==== {s['name']}: " in log for s in report["steps"] if s["status"] == "ok" and s["cmd"])


def test_a_failing_step_is_named_exits_non_zero_and_the_report_is_written(tmp_path, cache_dir):
    """The demo step under no launcher: the cheapest step that can be made to fail (a launcher's failed rank is
    the same non-zero exit to the check; the dry runs above run every step's launcher)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_key: 1\n")
    proc = gpu_check(cache_dir, tmp_path / "OUT", "--steps", "environment,dp_demo", "--demo_config", str(bad))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu-check FAILED: dp_demo" in proc.stderr
    folder = tmp_path / "OUT" / "gpu_check"
    report = read_report(folder)
    assert report["complete"] and not report["ok"] and report["failed"] == ["dp_demo"]
    assert {s["name"]: s["status"] for s in report["steps"]} == {"environment": "ok", "dp_demo": "failed"}
    assert "exit" in report["steps"][1]["detail"] and "no_such_key" in (folder / "gpu_check.log").read_text()


def test_without_a_cuda_torch_it_refuses_in_one_line_unless_dry(tmp_path, cache_dir):
    env = base_env(cache_dir)
    env.update(PYTHON=str(BIN / "python"))
    env.pop("HVT_GPU_CHECK_DRY", None)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "fix:" in proc.stderr and not os.path.exists(REPO / ".venv-gpu")


def gone(pid: int) -> bool:
    """Ended (a zombie waiting for init to reap it counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_until_gone(pids: list[int], seconds: float = 30) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not gone(p)]


def test_a_step_that_times_out_ends_every_process_it_started(tmp_path):
    """A launcher killed on its own leaves its workers running (holding the GPU and the ports), and launchers put
    their workers into sessions of their own (torchrun, horovodrun's middleman): a step's timeout ends them all."""
    import argparse

    from horovod_train.gpucheck import runner

    pids = tmp_path / "pids"
    launcher = ["bash", "-c", f"sleep 300 & echo $! >> {pids}; setsid sleep 300 & echo $! >> {pids}; wait"]
    ctx = runner.Context(argparse.Namespace(), str(BIN / "python"), tmp_path, tmp_path, True, time.monotonic() + 60)
    entry = runner.run_step(ctx, runner.Step("launcher", "a launcher and its workers", launcher, 1.0, timeout_s=3))
    assert entry["status"] == "failed" and entry["detail"] == "timeout 3s"
    workers = [int(line) for line in pids.read_text().split()]
    left = wait_until_gone(workers)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert len(workers) == 2 and not left, "a worker outlived its step's timeout"


def step_processes(marker: str) -> list[int]:
    """The processes whose command line names ``marker`` (the check's work folder: its launchers and ranks), the
    check's own script left out: its command substitutions fork subshells with its command line, which a count
    caught while two of them lived (3 processes, then 1 once they ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace") if entry.name.isdigit() else ""
        except OSError:
            continue
        if marker in cmdline and str(SCRIPT) not in cmdline:
            found.append(int(entry.name))
    return [p for p in found if not gone(p)]


def test_sigterm_ends_the_check_and_every_process_of_its_step(tmp_path, cache_dir):
    """A lent machine's timeout (or a user) ends the check with SIGTERM: the step in flight goes with it, torchrun's
    workers in their own sessions too, and the report says so."""
    work, folder = tmp_path / "work", tmp_path / "OUT" / "gpu_check"
    # ddp_demo: torchrun's worker is in a session of its own, and the step reads no other step's files (equiv_ddp
    # would bring equiv_single along, a whole training process before the one this test ends)
    cmd = ["bash", str(SCRIPT), "--steps", "ddp_demo", "--work_dir", str(work)]
    check = subprocess.Popen(cmd, cwd=REPO, env=dry_env(cache_dir, tmp_path / "OUT"), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while len(step_processes(str(work))) < 3 and time.monotonic() < deadline:  # the check, torchrun, its rank
        time.sleep(0.2)
    started = step_processes(str(work))
    check.send_signal(signal.SIGTERM)
    output, _ = check.communicate(timeout=60)
    left = wait_until_gone(started, seconds=3)  # ended with the check, not when their training would have finished
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert len(started) >= 3, output[-3000:]
    assert check.returncode == 143 and not left, output[-3000:]
    report = read_report(folder)
    assert report["interrupted"] == "SIGTERM" and not report["complete"] and report["running"] == {}
    assert "interrupted by SIGTERM" in (folder / "gpu_check.log").read_text()


def test_the_second_environment_sees_the_first_ones_packages_after_its_own(tmp_path):
    """The environment for Horovod without NCCL: its own site-packages first (its Horovod), then the running
    python's (torch, the dependencies), whose .pth files run too."""
    from horovod_train.gpucheck.builds import make_gloo_env

    python = make_gloo_env(tmp_path / "venv")
    probe = "import json, sys, torch; print(json.dumps([sys.prefix, torch.__file__, sys.path]))"
    proc = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin"})
    assert proc.returncode == 0, proc.stderr
    prefix, torch_file, path = json.loads(proc.stdout)
    own = next(i for i, p in enumerate(path) if p.startswith(str(tmp_path / "venv")) and p.endswith("site-packages"))
    parent = next(i for i, p in enumerate(path) if p.startswith(sys.prefix) and p.endswith("site-packages"))
    assert Path(prefix) == tmp_path / "venv" and torch_file.startswith(sys.prefix) and own < parent
    assert make_gloo_env(tmp_path / "venv") == python  # made once, kept
