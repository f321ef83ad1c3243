"""The steps of `scripts/gpu_check.sh`: set up Horovod with NCCL offline, train and benchmark on one GPU,
report a table on stdout and ``gpu_check.json``.

Run through the script (it picks the python whose torch is a CUDA build), or from an installed wheel as
``python -m horovod_train.gpucheck``: nothing here reads the checkout; only the Horovod build steps need
its ``scripts/`` (``--scripts_dir``, which the script passes). ``--dry_run`` runs every step that does not
need CUDA on the CPU with tiny sizes, so the plumbing is tested (tests/integration/test_gpu_check.py).
Every step is a subprocess with its own log and timeout, under one overall time budget; a step that
fails is named and the report is still written (after every step, so even a killed run leaves one).
Only the standard library is imported here: the dependencies may not be installed yet when it starts.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from horovod_train.errors import UsageError, exit_with
from horovod_train.files import write_json_atomic
from horovod_train.gpucheck.nccl import cuda_arch, nccl_dirs
from horovod_train.tables import format_table

# The folder holding this copy of the package (a checkout, or site-packages): the steps' python imports it.
IMPORT_ROOT = Path(__file__).resolve().parents[2]
# step -> the script of the checkout's scripts/ it runs (--scripts_dir)
SCRIPT_STEPS = {"horovod": "build_horovod.sh", "check_build": "check_horovod_build.sh"}
DEMO_ACCURACY = 0.80  # README: `make demo` reaches >= 0.80
TARGETS = {"samples_per_second": 6000.0, "mfu": 0.35, "horovod_vs_plain": 0.97}
# module -> pip name: what the training and the benchmarks import beyond torch
MODULES = {
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "datasets": "datasets",
    "evaluate": "evaluate",
    "pyarrow": "pyarrow",
    "yaml": "pyyaml",
    "cloudpickle": "cloudpickle",
    "psutil": "psutil",
    "packaging": "packaging",
    "matplotlib": "matplotlib",
}
NOTES = [
    "What this one-GPU run proves: the CUDA build (torch, Horovod with NCCL), training on the GPU in fp32, bf16 "
    "and fp16 with the GradScaler under the Horovod, DDP and DataParallel engines, NCCL initialised at one rank, "
    "and Horovod's allreduce/allgather/broadcast on CUDA tensors of every dtype the suite sends (step "
    "hvd_collectives). It cannot test multi-GPU NCCL: NCCL refuses two ranks on one GPU, so Horovod and DDP "
    "run at np=1.",
    "Horovod's gradient all-reduce is NOT tested here: Horovod 0.28.1's DistributedOptimizer registers its "
    "gradient hooks only when size() > 1, so at np=1 synchronize() does nothing; the bert_* Horovod steps and "
    "the 'Horovod np=1 within 3% of plain' target measure plain AdamW behind Horovod's wrapper.",
    "Needs a node with 2+ GPUs (this check does not run it) before the GPU path can be called verified: "
    "Horovod's and DDP's gradient all-reduce over NCCL between GPUs (the horovod_demo and ddp_demo commands "
    "with -np 2 / --nproc_per_node 2: equal param_checksum_per_rank), DataParallel with 2+ replicas (per-thread "
    "bf16 autocast), fp16's GradScaler across ranks, and elastic resizes on GPUs.",
    "MFU = 6 x non-embedding parameters x non-padding tokens/s / the GPU's peak dense bf16 FLOP/s (table by "
    "device name in horovod_train/bench/gpu.py): forward 2 + backward 4 FLOPs per parameter per token; "
    "embeddings (lookups), attention's quadratic term and the padding not counted.",
]
ONE_GPU_VERDICT = "one GPU cannot exercise Horovod's or DDP's gradient all-reduce; a 2-GPU run is required"
ENV_SNIPPET = r"""
import json, platform, subprocess, torch
info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]}
if torch.cuda.is_available():
    info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
    q = ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader"]
    info["driver"] = subprocess.run(q, capture_output=True, text=True).stdout.strip()
try:
    import horovod, horovod.torch as hvd
    info["horovod"] = horovod.__version__
    info["horovod_nccl_built"] = bool(hvd.nccl_built())
except Exception as exc:
    info["horovod"] = f"not importable: {exc}"
print(json.dumps(info))
"""
# Horovod's collectives on this rank's device, for every dtype the suite sends (fp32 gradients and metrics,
# fp16 compression, int64 lengths and checksums, float64 sums, uint8 payloads: gathered and broadcast only,
# Horovod all-reduces no uint8): exact results or exit 1.
COLLECTIVES_SNIPPET = r"""
import json, sys, torch, horovod.torch as hvd
hvd.init()
cuda = torch.cuda.is_available()
device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
if sys.argv[1:] == ["--require-cuda"] and not cuda:
    sys.exit("error: no CUDA device; fix: run on a GPU node")
results = {}
for name in ("float32", "float16", "int64", "float64", "uint8"):
    dtype, base = getattr(torch, name), torch.arange(6) % 5
    mine = (base + hvd.rank()).to(device=device, dtype=dtype)
    gathered = hvd.allgather(mine, name=f"check.gather.{name}")
    received = mine.clone() if hvd.rank() == 0 else torch.zeros_like(mine)
    hvd.broadcast_(received, root_rank=0, name=f"check.broadcast.{name}")
    total = sum(base + r for r in range(hvd.size())).to(dtype)
    everyone = torch.cat([(base + r).to(dtype) for r in range(hvd.size())])
    results[name] = {
        "allgather": gathered.device == device and torch.equal(gathered.cpu(), everyone),
        "broadcast": torch.equal(received.cpu(), base.to(dtype)),
    }
    if dtype != torch.uint8:
        summed = hvd.allreduce(mine, op=hvd.Sum, name=f"check.sum.{name}")
        exact = summed.device == device and summed.dtype == dtype and torch.equal(summed.cpu(), total)
        results[name]["allreduce"] = exact
report = {"device": str(device), "size": hvd.size(), "nccl_built": bool(hvd.nccl_built()), "ops": results}
print(json.dumps(report))
sys.exit(0 if all(all(ops.values()) for ops in results.values()) else 1)
"""
BERT_MODEL_SNIPPET = r"""
import sys
from transformers import BertForSequenceClassification
from horovod_train.bench.common import bert_config
BertForSequenceClassification(bert_config(sys.argv[1])).save_pretrained(sys.argv[2])
print(f"saved {sys.argv[1]} (random init) to {sys.argv[2]}")
"""


class CheckFailed(Exception):
    """A step ran but its result is wrong (accuracy too low, loss not decreasing, ...)."""


@dataclasses.dataclass
class Step:
    name: str
    what: str
    cmd: list[str] | None  # None: nothing to run (``skip`` or ``error`` says why)
    check: Callable[[Context, Step, str], tuple[str, dict[str, Any]]] | None = None
    timeout_s: float = 120.0
    needs_cuda: bool = False
    after: str | None = None  # skipped unless this step passed
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    run_dir: Path | None = None
    skip: str | None = None
    error: str | None = None


@dataclasses.dataclass
class Context:
    args: argparse.Namespace
    python: str
    out: Path
    work: Path
    dry: bool
    deadline: float
    results: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def tool(self, name: str) -> str:
        """A console script next to the python (horovodrun, torchrun), else from PATH."""
        local = Path(self.python).parent / name
        return str(local) if local.exists() else (shutil.which(name) or name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    out = Path(os.environ["OUT"]) / "gpu_check" if os.environ.get("OUT") else Path("runs/gpu_check")
    dry = os.environ.get("HVT_GPU_CHECK_DRY") == "1"
    parser.add_argument("--dry_run", "--dry-run", action="store_true", default=dry, help="CPU, tiny sizes")
    parser.add_argument("--output_dir", type=Path, default=out, help="report, logs, metrics, bench outputs")
    parser.add_argument("--work_dir", type=Path, default=None, help="model and run directories (large; not kept)")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--budget_s", type=float, default=float(os.environ.get("HVT_GPU_CHECK_BUDGET_S", 520)))
    parser.add_argument("--demo_config", default="demo", help="the demo job's config (default: the packaged demo)")
    parser.add_argument(
        "--scripts_dir",
        type=Path,
        default=None,
        help="the checkout's scripts/ (build_horovod.sh, check_horovod_build.sh) for the steps "
        "horovod and check_build; scripts/gpu_check.sh passes it",
    )
    parser.add_argument("--steps", default=None, help="comma-separated step names to run (default: all)")
    parser.add_argument("--bert_steps", type=int, default=200, help="training steps of each BERT-base run")
    parser.add_argument("--batch_sizes", default="128,256,64", help="bench gpu batch sweep (plain order)")
    parser.add_argument("--compile_batch_sizes", default="128,256", help="bench gpu batch sweep with torch.compile")
    parser.add_argument("--peak_tflops", type=float, default=None, help="for MFU (default from the GPU's name)")


def log_path(ctx: Context, step: Step) -> Path:
    return ctx.out / "logs" / f"{step.name}.log"


def step_env(ctx: Context, step: Step) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(IMPORT_ROOT), env.get("PYTHONPATH", "")) if p),
        PYTHONUNBUFFERED="1",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HOROVOD_TRAIN_CACHE=str(ctx.work / "cache"),
        PATH=f"{Path(ctx.python).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    if ctx.dry:
        env.setdefault("OMP_NUM_THREADS", "1")
    env.update(step.env)
    return env


def run_step(ctx: Context, step: Step) -> dict[str, Any]:
    """Run one step (unless skipped), check it, and return its report entry."""
    entry: dict[str, Any] = {"name": step.name, "what": step.what, "status": "ok", "seconds": 0.0, "detail": ""}
    entry["cmd"] = step.cmd
    remaining = ctx.deadline - time.monotonic()
    if step.skip or (step.needs_cuda and ctx.dry):
        return {**entry, "status": "skipped", "detail": step.skip or "needs CUDA (dry run)"}
    if step.after and ctx.results.get(step.after, {}).get("status") != "ok":
        return {**entry, "status": "skipped", "detail": f"needs step {step.after}"}
    if remaining < 10:
        return {**entry, "status": "skipped", "detail": "time budget spent"}
    if step.error:
        return {**entry, "status": "failed", "detail": step.error}
    if step.cmd is None:
        return {**entry, "detail": "nothing to do (all present)"}
    log = log_path(ctx, step)
    log.parent.mkdir(parents=True, exist_ok=True)
    entry["log"] = str(log)
    started = time.monotonic()
    timeout = min(step.timeout_s, remaining)
    print(f"[gpu-check] {step.name}: {step.what} (timeout {timeout:.0f}s)", flush=True)
    try:
        with log.open("w") as f:
            f.write(" ".join(step.cmd) + "\n")
            f.flush()
            returncode = run_in_own_group(step.cmd, step_env(ctx, step), f, timeout)
    except subprocess.TimeoutExpired:
        return {**entry, "status": "failed", "seconds": time.monotonic() - started, "detail": f"timeout {timeout:.0f}s"}
    entry["seconds"] = round(time.monotonic() - started, 1)
    text = log.read_text(errors="replace")
    if returncode != 0:
        return {**entry, "status": "failed", "detail": f"exit {returncode}: {last_line(text)}"}
    if step.check:
        try:
            entry["detail"], entry["metrics"] = step.check(ctx, step, text)
        except (CheckFailed, OSError, ValueError, KeyError) as exc:
            return {**entry, "status": "failed", "detail": f"check: {exc}"}
    return entry


def run_in_own_group(cmd: list[str], env: dict[str, str], log: Any, timeout: float) -> int:
    """Run ``cmd`` in a process group of its own and return its exit status. On a timeout (or any
    interruption) the whole group is ended: torchrun's and horovodrun's workers too, not only the launcher,
    whose workers would otherwise keep the GPU and the step's ports."""
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.returncode is None:
            end_group(proc)


def end_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to the group, then SIGKILL to whatever of it is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or "Error" in line]
    return (errors or lines or [""])[-1].strip()[:300]


# --- checks -----------------------------------------------------------------------------------------


def read_losses(run_dir: Path) -> list[float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [float(r["loss"]) for r in records]


def keep_outputs(ctx: Context, step: Step) -> None:
    """The small files of a run (metrics, results) into the output dir; the model stays in the work dir."""
    assert step.run_dir is not None
    dest = ctx.out / "runs" / step.name
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "all_results.json", "run_config.json"):
        if (step.run_dir / name).is_file():
            shutil.copy2(step.run_dir / name, dest / name)


def check_training(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    """Loss finite and decreasing (mean of the last quarter of logged losses below the first quarter's)."""
    assert step.run_dir is not None
    keep_outputs(ctx, step)
    losses = read_losses(step.run_dir)
    results = json.loads((step.run_dir / "all_results.json").read_text())
    if len(losses) < 2 or not all(math.isfinite(x) for x in losses):
        raise CheckFailed(f"losses not finite or too few: {losses[:8]}")
    quarter = max(1, len(losses) // 4)
    first, last = sum(losses[:quarter]) / quarter, sum(losses[-quarter:]) / quarter
    metrics = {
        "first_loss": first,
        "last_loss": last,
        "logged_losses": len(losses),
        "accuracy": results.get("eval_accuracy"),
        "engine": results.get("engine"),
        "backend": results.get("backend") or results.get("controller"),
        "world_size": results.get("world_size"),
        "wall_time_s": results.get("wall_time_s"),
    }
    if not last < first:
        raise CheckFailed(f"loss not decreasing: first-quarter mean {first:.4f}, last-quarter mean {last:.4f}")
    return f"loss {first:.3f} -> {last:.3f}, accuracy {metrics['accuracy']:.3f}", metrics


def check_demo(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    detail, metrics = check_training(ctx, step, text)
    if not ctx.dry and metrics["accuracy"] < DEMO_ACCURACY:
        raise CheckFailed(f"accuracy {metrics['accuracy']:.3f} < {DEMO_ACCURACY}")
    if not ctx.dry and step.name == "ddp_demo" and metrics["backend"] != "nccl":
        raise CheckFailed(f"DDP backend {metrics['backend']}, not nccl")
    return detail, metrics


def check_doctor(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    nccl = "[X] NCCL" in text
    devices = re.findall(r"\b(cuda:\d+|cpu)\b", text)
    if not ctx.dry and not (nccl and any(d.startswith("cuda") for d in devices)):
        raise CheckFailed(f"NCCL built: {nccl}, devices: {devices or 'none'}")
    return f"NCCL built: {'yes' if nccl else 'no'}, devices {sorted(set(devices))}", {"doctor": text.splitlines()[-14:]}


def check_collectives(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    line = next(line for line in reversed(text.splitlines()) if '{"device"' in line)  # after horovodrun's tag
    report = json.loads(line[line.index("{") :])
    dtypes = ", ".join(report["ops"])
    return f"allreduce, allgather, broadcast exact on {report['device']} for {dtypes} (np={report['size']})", report


def check_environment(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    info = json.loads(text.strip().splitlines()[-1])
    gpus = ", ".join(info["gpus"]) or "no GPU"
    return f"{gpus}; torch {info['torch']}, CUDA {info['cuda']}, horovod {info['horovod']}", info


def check_bench(ctx: Context, step: Step, text: str) -> tuple[str, dict[str, Any]]:
    assert step.run_dir is not None
    report = json.loads((step.run_dir / "gpu.json").read_text())
    rows = {r["engine"]: r for r in report["rows"]}
    keys = ("batch_size", "samples_per_second", "tokens_per_second", "mfu", "step_ms", "vs_single", "peak_memory_mb")
    metrics = {engine: {k: r.get(k) for k in keys} for engine, r in rows.items()}
    metrics["torch_compile"] = bool(report["args"].get("torch_compile"))
    metrics["device"] = report.get("device")
    single, hvd = rows["single"], rows.get("horovod", {})
    detail = (
        f"plain {single['samples_per_second']:.0f} samples/s, {single['tokens_per_second']:.0f} tokens/s, "
        f"MFU {100 * single['mfu']:.1f}%; horovod {hvd.get('vs_single', float('nan')):.3f}x"
    )
    return detail, metrics


# --- setup: dependencies and Horovod ----------------------------------------------------------------


def deps_step(ctx: Context) -> Step:
    missing = sorted({pip for module, pip in MODULES.items() if importlib.util.find_spec(module) is None})
    step = Step("deps", "pure-Python dependencies present (installed from HVT_WHEELS if not)", None, timeout_s=180)
    wheels = os.environ.get("HVT_WHEELS")
    if not missing:
        pass
    elif not wheels or not Path(wheels).is_dir():
        step.error = f"missing {', '.join(missing)}; set HVT_WHEELS to a wheel folder (scripts/gpu_bundle.sh)"
    else:
        step.cmd = [ctx.python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheels, *missing]
    return step


def horovod_env(ctx: Context) -> dict[str, str]:
    env = {"PYTHON": ctx.python, "HOROVOD_WHEEL_CACHE": str(ctx.work / "horovod-wheels")}
    wheels = Path(os.environ.get("HVT_WHEELS") or "/nonexistent")
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels)} if wheels.is_dir() else {}
    prebuilt = sorted(wheels.glob(f"horovod-*-cp3{sys.version_info[1]}-*linux_x86_64.whl"))
    if prebuilt:
        env["HOROVOD_WHEEL"] = str(prebuilt[-1])
    if not (shutil.which("mpicxx") or shutil.which("mpicc")):
        env["HOROVOD_WITHOUT_MPI"] = "1"  # the check then does not ask for MPI either
    if not ctx.dry:
        env.setdefault("HOROVOD_BUILD_CUDA_CC_LIST", os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or cuda_arch())
        env.update(nccl_dirs(ctx.work / "nccl-link"))
    return env


def script(ctx: Context, step: str) -> str:
    """The checkout's script a setup step runs (checked by check_arguments before any step runs)."""
    return str((ctx.args.scripts_dir or Path("scripts")) / SCRIPT_STEPS[step])


def setup_steps(ctx: Context) -> list[Step]:
    env = horovod_env(ctx)
    build = Step(
        "horovod",
        "Horovod with NCCL (scripts/build_horovod.sh; from HOROVOD_SDIST, or HOROVOD_WHEEL, offline)",
        ["bash", script(ctx, "horovod")],
        timeout_s=420,
        env=env,
        after="deps",
    )
    check = Step(
        "check_build",
        "horovodrun --check-build lists PyTorch, Gloo (MPI if built), NCCL",
        ["bash", script(ctx, "check_build")],
        env=env,
        after="horovod",
    )
    environment = Step(
        "environment", "device, driver, torch, CUDA, NCCL, Horovod versions", [ctx.python, "-c", ENV_SNIPPET]
    )
    environment.check = check_environment
    return [deps_step(ctx), build, check, environment]


# --- training and benchmark steps -------------------------------------------------------------------

DRY_DEMO = ["--synthetic_num_examples", "400", "--max_steps", "16", "--logging_steps", "4"]
# 24 steps at 1e-4 leave a random tiny-bert at chance (loss ~ln 3), rising as often as falling: 1e-3 learns.
DRY_BERT = ["--synthetic_num_examples", "400", "--per_device_train_batch_size", "8", "--logging_steps", "3"]
DRY_BERT += ["--learning_rate", "1e-3"]


def train_step(ctx: Context, name: str, what: str, launcher: list[str], args: list[str], **kw: Any) -> Step:
    run_dir = ctx.work / "runs" / name
    cmd = [*launcher, ctx.python, "-m", "horovod_train", "train", *args]
    cmd += ["--output_dir", str(run_dir), "--overwrite_output_dir", "--disable_tqdm", "--save_strategy", "no"]
    return Step(name, what, cmd, run_dir=run_dir, **kw)


def bert_args(ctx: Context, bert_dir: Path) -> list[str]:
    bert = ["--model_name_or_path", str(bert_dir), "--tokenizer_name", "tiny-bert", "--dataset_name", "synthetic-nli"]
    bert += ["--learning_rate", "1e-4", "--warmup_ratio", "0.1", "--per_device_eval_batch_size", "256"]
    if ctx.dry:
        return [*bert, "--max_steps", "24", *DRY_BERT]
    sizes = ["--synthetic_num_examples", "8000", "--per_device_train_batch_size", "32", "--logging_steps", "10"]
    return [*bert, "--max_steps", str(ctx.args.bert_steps), *sizes]


def training_steps(ctx: Context) -> list[Step]:
    # Not in the image's build stage; the two rows alone (the mpirun row may talk to MPI, through mpi4py).
    from horovod_train.launching.horovodrun import Horovodrun
    from horovod_train.launching.torchrun import Torchrun

    hvd = Horovodrun().command([], 1, executable=ctx.tool("horovodrun"))  # a launcher prefix: the program follows
    ddp = Torchrun().command([], 1, executable=ctx.tool("torchrun"))
    demo = ["--config", ctx.args.demo_config, *(DRY_DEMO if ctx.dry else [])]
    bert_dir = ctx.work / "bert-model"
    bert = bert_args(ctx, bert_dir)
    model = "tiny-bert" if ctx.dry else "bert-base-cased"
    n = 24 if ctx.dry else ctx.args.bert_steps
    doctor = Step("doctor", "doctor under horovodrun -np 1: device map, NCCL built", None, check=check_doctor)
    doctor.cmd = [*hvd, ctx.python, "-m", "horovod_train", "doctor"]
    collectives = Step(
        "hvd_collectives",
        "Horovod allreduce/allgather/broadcast, np=1, CUDA tensors: fp32, fp16, int64, float64 (+ uint8 no allreduce)",
        [*hvd, ctx.python, "-c", COLLECTIVES_SNIPPET, *([] if ctx.dry else ["--require-cuda"])],
        check=check_collectives,
    )
    acc = "" if ctx.dry else f" to accuracy >= {DEMO_ACCURACY}"
    save = [ctx.python, "-c", BERT_MODEL_SNIPPET, model, str(bert_dir)]
    # (name, what, launcher, arguments, check, needs CUDA, after)
    table = [
        ("horovod_demo", f"demo job, Horovod np=1 (NCCL){acc}", hvd, [*demo, "--engine", "horovod"], check_demo),
        ("ddp_demo", f"demo job, DDP np=1 (NCCL){acc}", ddp, [*demo, "--engine", "ddp"], check_demo),
        ("bert_fp32", f"{model} {n} steps fp32, Horovod np=1", hvd, [*bert, "--engine", "horovod"], check_training),
        ("bert_bf16", f"{model} {n} steps bf16, Horovod np=1", hvd, [*bert, "--engine", "horovod", "--bf16"], None),
        ("bert_fp16", f"{model} {n} steps fp16 + GradScaler, Horovod np=1", hvd, [*bert, "--fp16"], None),
        ("bert_bf16_ddp", f"{model} {n} steps bf16, DDP np=1", ddp, [*bert, "--engine", "ddp", "--bf16"], None),
        ("dp_demo", "demo job, DataParallel on the visible GPUs", [], [*demo, "--engine", "dp"], check_demo),
    ]
    model_step = Step("bert_model", f"{model} architecture, random init, saved locally", save, timeout_s=120)
    steps = [doctor, collectives, model_step]
    for name, what, launcher, args, check in table:
        step = train_step(ctx, name, what, launcher, args, check=check or check_training, timeout_s=240)
        if name.startswith("bert_"):
            step.what += ": loss finite and decreasing"
            step.after = "bert_model"
        step.needs_cuda = name == "bert_fp16"
        steps.append(step)
    return steps


def bench_steps(ctx: Context) -> list[Step]:
    """`bench gpu`: bert-base-cased, random init, MNLI-like lengths grouped by length, bf16, plain vs
    Horovod np=1 in one process; batch sizes swept, then with torch.compile (tiny and one size when dry)."""
    base = [ctx.python, "-m", "horovod_train", "bench", "gpu", "--bf16", "--group_by_length"]
    if ctx.dry:
        sweeps = [(False, 8)]
        base += ["--tiny", "--steps", "2", "--warmup", "1", "--repeats", "2"]
    else:
        sizes = [(False, int(b)) for b in ctx.args.batch_sizes.split(",") if b]
        sweeps = sizes + [(True, int(b)) for b in ctx.args.compile_batch_sizes.split(",") if b]
        base += ["--steps", "30", "--warmup", "5", "--repeats", "3"]
        base += ["--peak_tflops", str(ctx.args.peak_tflops)] if ctx.args.peak_tflops else []  # else by GPU name
    steps = []
    for compiled, batch in sweeps:
        name = f"bench{'_compile' if compiled else ''}_b{batch}"
        out = ctx.out / "bench" / name
        cmd = [*base, "--per_device_train_batch_size", str(batch), "--output_dir", str(out)]
        cmd += ["--torch_compile", "--warmup", "15"] if compiled else []
        what = f"bench gpu bf16 batch {batch}{' torch.compile' if compiled else ''}: plain vs Horovod np=1"
        steps.append(Step(name, what, cmd, check=check_bench, timeout_s=240, run_dir=out))
    return steps


def plan(ctx: Context) -> list[Step]:
    steps = [*setup_steps(ctx), *training_steps(ctx), *bench_steps(ctx)]
    if ctx.args.steps:
        wanted = set(ctx.args.steps.split(","))
        unknown = wanted - {s.name for s in steps}
        if unknown:
            raise UsageError(f"unknown step(s) {', '.join(sorted(unknown))}", f"use {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in wanted]
        for s in steps:
            s.after = s.after if s.after in wanted else None
    return steps


# --- report -----------------------------------------------------------------------------------------


def bench_summary(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The best plain configuration of the sweep, its Horovod np=1 ratio, and the issue's targets."""
    runs = [e for e in entries if e["name"].startswith("bench") and e["status"] == "ok"]
    if not runs:
        return {}
    best = max(runs, key=lambda e: e["metrics"]["single"]["samples_per_second"])
    single, hvd = best["metrics"]["single"], best["metrics"].get("horovod", {})
    ratio = hvd.get("vs_single", float("nan"))
    return {
        "best": best["name"],
        "torch_compile": best["metrics"]["torch_compile"],
        "batch_size": single["batch_size"],
        "samples_per_second": single["samples_per_second"],
        "tokens_per_second": single["tokens_per_second"],
        "mfu": single["mfu"],
        "horovod_vs_plain": ratio,
        "targets": TARGETS,
        "met": {
            "samples_per_second": single["samples_per_second"] >= TARGETS["samples_per_second"],
            "mfu": single["mfu"] >= TARGETS["mfu"],
            "horovod_vs_plain": ratio >= TARGETS["horovod_vs_plain"],
        },
    }


def write_report(ctx: Context, entries: list[dict[str, Any]], done: bool) -> dict[str, Any]:
    failed = [e["name"] for e in entries if e["status"] == "failed"]
    env = next((e.get("metrics", {}) for e in entries if e["name"] == "environment"), {})
    report = {
        "dry_run": ctx.dry,
        "complete": done,
        "python": ctx.python,
        "budget_s": ctx.args.budget_s,
        "environment": env,
        "steps": entries,
        "failed": failed,
        "ok": done and not failed,
        "bench": bench_summary(entries),
        "notes": NOTES,
        "gpu_path_verified": False,  # whatever passed here: see ONE_GPU_VERDICT
    }
    write_json_atomic(ctx.out / "gpu_check.json", report)
    return report


def print_report(report: dict[str, Any], out: Path) -> None:
    rows = [[e["name"], e["status"], f"{e['seconds']:.0f}", e["detail"][:110]] for e in report["steps"]]
    print("\n".join(["", *format_table(["step", "status", "s", "detail"], rows)]))
    bench = report["bench"]
    if bench:
        met = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in bench["met"].items())
        print(
            f"best bench: {bench['best']}: {bench['samples_per_second']:.0f} samples/s, "
            f"{bench['tokens_per_second']:.0f} tokens/s, MFU {100 * bench['mfu']:.1f}%, Horovod np=1 "
            f"{bench['horovod_vs_plain']:.3f}x plain (targets: {met})"
        )
    for note in report["notes"]:
        print(f"note: {note}")
    print(f"GPU path verified: no ({ONE_GPU_VERDICT})")
    if report["dry_run"]:
        print("dry run (CPU, tiny sizes): tests the script's plumbing, measures nothing")
    print(f"wrote {out / 'gpu_check.json'}")
    if report["failed"]:
        print(f"gpu-check FAILED: {', '.join(report['failed'])} (logs in {out / 'logs'})", file=sys.stderr)


def check_arguments(args: argparse.Namespace) -> None:
    """The checkout's scripts that the chosen steps run are there, before anything is written."""
    wanted = set(args.steps.split(",")) if args.steps else set(SCRIPT_STEPS)
    steps = [step for step in SCRIPT_STEPS if step in wanted]
    folder = args.scripts_dir
    missing = [SCRIPT_STEPS[s] for s in steps if folder is None or not (folder / SCRIPT_STEPS[s]).is_file()]
    if missing:
        where = f"--scripts_dir {args.scripts_dir} has no" if args.scripts_dir else "no --scripts_dir for"
        raise UsageError(
            f"{where} {', '.join(missing)} (steps {', '.join(steps)} build and check Horovod)",
            "pass --scripts_dir CHECKOUT/scripts (scripts/gpu_check.sh does), or --steps without horovod,check_build",
        )


def run_steps(ctx: Context, steps: list[Step]) -> dict[str, Any]:
    """Every step in order; the report rewritten after each, so even a killed run leaves one."""
    entries: list[dict[str, Any]] = []
    for step in steps:
        entry = run_step(ctx, step)
        ctx.results[step.name] = entry
        entries.append(entry)
        print(f"[gpu-check] {step.name}: {entry['status']} {entry['detail']}", flush=True)
        write_report(ctx, entries, done=False)
    return write_report(ctx, entries, done=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        check_arguments(args)
    except UsageError as error:
        exit_with(error)
    out = args.output_dir.resolve()
    work = (args.work_dir or Path(os.environ.get("TMPDIR", "/tmp")) / f"hvt-gpu-check-{os.getpid()}").resolve()
    ctx = Context(args, args.python, out, work, args.dry_run, time.monotonic() + args.budget_s)
    try:
        steps = plan(ctx)
        out.mkdir(parents=True, exist_ok=True)
        work.mkdir(parents=True, exist_ok=True)
        report = run_steps(ctx, steps)
    except UsageError as error:
        exit_with(error)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    print_report(report, out)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
