"""The GPU check's plan: its steps in value order, each with the time it is expected to take on one H100/H200
with 16 cores (ESTIMATES_S: estimates until a run on the node replaces them), and the dry run's tiny sizes.

First the facts (nvidia-smi, then Python, torch, CUDA, NCCL, the build tools: printed before anything can
fail), the dependencies, both Horovod builds at once (this GPU's architecture only); then NCCL's collectives
at np=1; BERT-base's bf16 throughput and MFU; two ranks sharing the one GPU against one process, through
Horovod built without NCCL (its CUDA tensors go through Gloo on the host: real gradient hooks, averaging and
fusion) and DDP with Gloo on CUDA tensors; fp16 with the GradScaler; DDP over NCCL; then the rest, as far as
the budget goes. A step starts only if its estimate fits in what is left of the budget. Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from horovod_train.common.errors import UsageError
from horovod_train.engines.specs import ENGINES, EngineSpec, GpuDemo, reference_engine
from horovod_train.gpucheck import checks, wheels
from horovod_train.gpucheck.nccl import cuda_arch, nccl_dirs
from horovod_train.gpucheck.runner import Context, Step

# Seconds on one H100/H200 with 16 cores, cold (nothing installed or built), rounded up from runs on one H200
# (docs/performance.md "First runs on a GPU", 2026-11-26 and 2026-11-28): the builds 151-182 s at once, a
# training step's process 20-35 s (starts dominate: torch, transformers, datasets), bench 25-52 s (batch 128
# first on a cold machine is the slow one), torch.compile of BERT-base 180 s.
ESTIMATES_S = {
    "nvidia_smi": 3,
    "environment": 10,
    "deps": 10,
    "builds": 185,  # both builds at once; 20 s when the wheels of an earlier run are there (KEPT_BUILDS_S)
    "hvd_collectives": 15,
    "bench_b128": 55,
    "equiv_single": 25,
    "equiv_horovod": 25,
    "equiv_ddp": 25,
    "bert_config": 15,
    "bert_fp16": 40,
    "ddp_demo": 30,
    "zero1_demo": 35,
    "fsdp_demo": 35,
    "bench_b256": 30,
    "horovod_demo": 35,
    "bench_compile_b128": 180,
    # Not measured yet: four Inductor compiles per compiled variant (one per bucket); 20 s of it the training loop's
    # row (its 165 steps at ~40 ms, the loader collating 256 examples a step, and its setup).
    "bench_shapes_b256": 380,
    # Not measured yet: three 0.5B contenders' 165 steps at ~120 ms (10k tokens a step, launch-bound as BERT-base's
    # 37 ms for 12 layers), their random inits on the CPU, bench_b128's cold start (45 s).
    "bench_decoder_b256": 150,
    "bert_bf16_ddp": 35,
    "dp_demo": 25,
    "doctor": 30,
}
KEPT_BUILDS_S = 20  # installing the two kept wheels and --check-build instead of building
UNMEASURED_DEMO_S = 35  # an engine row's demo not run on a GPU yet: the slowest demo's
# The check's own steps after bert_fp16 by their place among the engines' demos (EngineSpec.gpu_demo.order, lower
# first): what is most worth a lent GPU's minutes first, the budget cutting from the end.
LATER_STEPS = {"bench_b256": 40, "bench_compile_b128": 60, "bert_bf16_ddp": 70, "doctor": 90}
MODULES = {  # module -> pip name: what the training imports beyond torch and the node's image
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
    "cffi": "cffi",  # Horovod's setup_requires: setuptools would fetch it from the network (no network on the node)
}
# The job of tests/integration/test_engine_equivalence.py (docs/equivalence.md): 20 steps of tiny-bert, dropout
# off, Adam's eps 1e-6 (rounding noise in the attention key biases' zero gradient must not move them).
EQUIVALENCE_JOB = ["--model_name_or_path", "tiny-bert", "--dataset_name", "synthetic-nli",
                   "--synthetic_num_examples", "800", "--per_device_eval_batch_size", "80", "--learning_rate", "2e-4",
                   "--warmup_steps", "5", "--weight_decay", "0.01", "--max_steps", "20", "--logging_steps", "10",
                   "--dropout", "0", "--adam_epsilon", "1e-6", "--disable_tqdm"]  # fmt: skip
EQUIVALENCE_BATCH = 8  # per rank of the 2-rank runs; the single process takes 16
DRY_DEMO = ["--synthetic_num_examples", "400", "--max_steps", "16", "--logging_steps", "4"]
# The demo job shortened to show training converge (loss falls) on the GPU: one of its six epochs.
DEMO = ["--num_train_epochs", "1", "--logging_steps", "50"]
# 24 steps at 1e-4 leave a random tiny-bert at chance (loss ~ln 3), rising as often as falling: 1e-3 learns.
DRY_BERT = ["--synthetic_num_examples", "400", "--per_device_train_batch_size", "8", "--logging_steps", "3"]
DRY_BERT += ["--learning_rate", "1e-3", "--max_steps", "24"]


def estimate(name: str) -> float:
    return float(ESTIMATES_S[name])


def run_args(step: str, ctx: Context, args: list[str]) -> tuple[list[str], Path]:
    run_dir = ctx.work / "runs" / step
    return [*args, "--output_dir", str(run_dir), "--overwrite_output_dir", "--disable_tqdm"], run_dir


def train_step(ctx: Context, name: str, what: str, launcher: list[str], args: list[str], **kw: Any) -> Step:
    python = kw.pop("python", ctx.python)
    args, run_dir = run_args(name, ctx, [*args, "--save_strategy", "no"])
    cmd = [*launcher, python, "-m", "horovod_train", "train", *args]
    kw.setdefault("check", checks.check_training)
    seconds = kw.pop("estimate_s") if "estimate_s" in kw else estimate(name)
    return Step(name, what, cmd, seconds, run_dir=run_dir, after=("deps", *kw.pop("after", ())), **kw)


def launchers(ctx: Context, python: str | None = None) -> tuple[list[str], list[str]]:
    """horovodrun -np 1 --gloo and torchrun --nproc_per_node 1 prefixes (the program follows)."""
    # Not in the image's build stage; the two rows alone (the mpirun row may talk to MPI, through mpi4py).
    from horovod_train.launching.horovodrun import Horovodrun
    from horovod_train.launching.torchrun import Torchrun

    hvd = Horovodrun().command([], 1, executable=ctx.tool("horovodrun", python))
    return hvd, Torchrun().command([], 1, executable=ctx.tool("torchrun", python))


# --- the facts and the setup ------------------------------------------------------------------------------------


def node_program(ctx: Context, *args: str) -> list[str]:
    return [ctx.python, "-m", "horovod_train.gpucheck.node", *args]


def fact_steps(ctx: Context) -> list[Step]:
    smi = Step("nvidia_smi", "nvidia-smi: the GPU, its driver, memory and clocks", ["nvidia-smi"],
               estimate("nvidia_smi"), needs_cuda=True, echo=True)  # fmt: skip
    env = Step("environment", "Python (Python.h, distutils, pip can write), torch, CUDA, NCCL, GPU, build tools, "
               "package versions", node_program(ctx, "environment"), estimate("environment"),
               check=checks.check_environment, echo=True)  # fmt: skip
    return [smi, env, deps_step(ctx)]


def deps_step(ctx: Context) -> Step:
    missing = sorted({pip for module, pip in MODULES.items() if importlib.util.find_spec(module) is None})
    step = Step("deps", "the dependencies the node lacks, from HVT_WHEELS (pip --no-index)", None, estimate("deps"))
    wheel_dir = os.environ.get("HVT_WHEELS")
    if not missing:
        pass
    elif not wheel_dir or not Path(wheel_dir).is_dir():
        step.error = f"missing {', '.join(missing)}; set HVT_WHEELS to a wheel folder (scripts/gpu_bundle.sh)"
    else:
        step.cmd = [ctx.python, "-m", "pip", "install", "-q", "--no-index", "--find-links", wheel_dir, *missing]
    return step


def build_env(ctx: Context) -> dict[str, str]:
    """What scripts/build_horovod.sh reads: offline pip, the sdist or a prebuilt wheel, MPI or not, this GPU's
    architecture and torch's pip NCCL."""
    env = {"PYTHON": ctx.python}  # the builds give each of their two builds its own
    bundle = Path(os.environ.get("HVT_WHEELS") or "/nonexistent")
    env |= {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(bundle)} if bundle.is_dir() else {}
    prebuilt = sorted(bundle.glob(f"horovod-*-cp3{sys.version_info[1]}-*linux_x86_64.whl"))
    if prebuilt:
        env["HOROVOD_WHEEL"] = str(prebuilt[-1])
    if not (shutil.which("mpicxx") or shutil.which("mpicc")):
        env["HOROVOD_WITHOUT_MPI"] = "1"  # the check then does not ask for MPI either
    if not ctx.dry:
        env.setdefault("HOROVOD_BUILD_CUDA_CC_LIST", os.environ.get("HOROVOD_BUILD_CUDA_CC_LIST") or cuda_arch())
        toolkit = Path("/usr/local/cuda/bin")
        if not shutil.which("nvcc") and (toolkit / "nvcc").is_file():  # an image whose PATH lacks the toolkit
            env["PATH"] = f"{toolkit}{os.pathsep}{Path(ctx.python).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        env.update(nccl_dirs(ctx.wheel_cache.parent / "nccl-link"))  # kept: it is in the extension's RUNPATH
    return env


def gloo_env_dir(ctx: Context) -> Path:
    """The second environment (Horovod without NCCL), kept beside the wheel cache for a later run."""
    return ctx.wheel_cache.parent / "gpu-check-venv-horovod-gloo"


def builds_step(ctx: Context) -> Step:
    scripts = ctx.args.scripts_dir or Path("scripts")
    cmd = [ctx.python, "-m", "horovod_train.gpucheck.builds", "--scripts_dir", str(scripts)]
    cmd += ["--logs", str(ctx.details / "logs" / "builds")]
    cmd += [] if ctx.dry else ["--nccl", "--gloo_env", str(gloo_env_dir(ctx))]
    bundle = os.environ.get("HVT_WHEELS")
    kept = bool(bundle and list(Path(bundle).glob(wheels.PART_PREFIX + "*")))
    cmd += ["--parts_from", bundle] if bundle else []
    what = "Horovod with NCCL and Horovod without (2 ranks on one GPU), built at once for this GPU only; each "
    what += "installed and checked (horovodrun --check-build)"
    if ctx.dry:  # the CPU build is made by `make setup`: the plan is printed, nothing built or installed
        cmd.append("--plan_only")
        what = "Horovod: build_horovod's plan for the CPU build (a dry run builds nothing)"
    return Step("builds", what, cmd, KEPT_BUILDS_S if kept else estimate("builds"), check=checks.check_builds,
                prepare=with_build_env)  # fmt: skip


def with_build_env(ctx: Context, step: Step) -> None:
    """Found when the step starts, not when the plan is printed (it asks nvidia-smi and links NCCL)."""
    step.env |= build_env(ctx)


# --- the GPU's paths: collectives, throughput, two ranks on one GPU, training --------------------------------


def collectives_step(ctx: Context) -> Step:
    hvd, _ = launchers(ctx)
    program = node_program(ctx, "collectives", *([] if ctx.dry else ["--require-cuda"]))
    what = "NCCL through Horovod: allreduce/allgather/broadcast at np=1 on CUDA tensors, fp32, fp16, int64, float64"
    return Step("hvd_collectives", what + " (+ uint8: no allreduce)", [*hvd, *program], estimate("hvd_collectives"),
                check=checks.check_collectives, after=("horovod",))  # fmt: skip


def equivalence_steps(ctx: Context) -> list[Step]:
    """One process with batch 16, then two ranks of 8 on the one device (the GPU on the node, the CPU in a dry
    run): Horovod without NCCL and DDP with Gloo, each checked against the one process's parameters."""
    from horovod_train.launching.horovodrun import Horovodrun  # not in the image's build stage
    from horovod_train.launching.torchrun import Torchrun

    job = EQUIVALENCE_JOB
    hvd2 = Horovodrun().command([], 2, executable=ctx.tool("horovodrun", ctx.gloo_python))
    ddp2 = Torchrun().command([], 2, executable=ctx.tool("torchrun"))
    batch = ["--per_device_train_batch_size", str(EQUIVALENCE_BATCH)]
    single = ["--engine", reference_engine(), "--per_device_train_batch_size", str(2 * EQUIVALENCE_BATCH)]
    # Each two-rank run compares its parameters with the one process's model.safetensors.
    compared = {"reads": ("equiv_single",), "check": checks.check_equivalence}
    # --horovod_groups 0: one all-reduce per gradient, fused by Horovod's background thread, as on a GPU (on CPUs
    # the engine groups gradients into buckets by default): a dry run takes the GPU's path with CPU tensors.
    table = [
        ("equiv_single", "one process, batch 16: the parameters the 2-rank runs must reach", [], single, {}),
        ("equiv_horovod", "Horovod's gradient all-reduce, 2 ranks on one GPU (no NCCL: CUDA tensors through Gloo "
         "on the host): hooks, averaging, fusion", hvd2, ["--engine", "horovod", "--horovod_groups", "0", *batch],
         {"python": ctx.gloo_python, "after": ("horovod_gloo",), **compared}),
        ("equiv_ddp", "DDP's bucketed all-reduce, 2 ranks on one GPU (--ddp_backend gloo, CUDA tensors)", ddp2,
         ["--engine", "ddp", "--ddp_backend", "gloo", *batch], compared),
    ]  # fmt: skip
    return [train_step(ctx, name, what, launcher, [*job, *args], **kw) for name, what, launcher, args, kw in table]


def bert_steps(ctx: Context) -> list[Step]:
    """bert-base-cased's architecture (random init, tiny-bert's tokenizer; tiny-bert itself in a dry run)."""
    folder = ctx.work / "bert-base-config"
    config = Step("bert_config", "bert-base-cased's configuration for train --config_name (random init)",
                  node_program(ctx, "bert-config", str(folder)), estimate("bert_config"),
                  skip="a dry run trains tiny-bert" if ctx.dry else None)  # fmt: skip
    needs_config = () if ctx.dry else ("bert_config",)
    bert = ["--model_name_or_path", "tiny-bert", "--dataset_name", "synthetic-nli", "--warmup_ratio", "0.1"]
    bert += ["--per_device_eval_batch_size", "256"]
    if ctx.dry:
        bert += DRY_BERT
    else:
        bert += ["--config_name", str(folder), "--learning_rate", "1e-4", "--max_steps", str(ctx.args.bert_steps)]
        bert += ["--synthetic_num_examples", "8000", "--per_device_train_batch_size", "32", "--logging_steps", "10"]
    hvd, ddp = launchers(ctx)
    model = "tiny-bert" if ctx.dry else "bert-base-cased"
    n = 24 if ctx.dry else ctx.args.bert_steps
    fp16 = train_step(ctx, "bert_fp16", f"{model} {n} steps fp16 + GradScaler (CUDA only), Horovod np=1", hvd,
                      [*bert, "--engine", "horovod", "--fp16"], after=("horovod",), reads=needs_config,
                      needs_cuda=True)  # fmt: skip
    bf16_ddp = train_step(ctx, "bert_bf16_ddp", f"{model} {n} steps bf16, DDP np=1 (NCCL)", ddp,
                          [*bert, "--engine", "ddp", "--bf16"], reads=needs_config)  # fmt: skip
    for step in (fp16, bf16_ddp):  # reads: train --config_name reads the folder bert_config writes
        step.what += ": loss finite and decreasing"
    return [config, fp16, bf16_ddp]


def demo_steps(ctx: Context) -> list[tuple[int, Step]]:
    """The demo job (tiny-bert on synthetic-nli) for one epoch, one per engine row that has a demo (training
    converges on the GPU), each with its order among the later steps."""
    demo = ["--config", ctx.args.demo_config, *(DRY_DEMO if ctx.dry else DEMO)]
    return [(spec.gpu_demo.order, demo_step(ctx, spec, spec.gpu_demo, demo)) for spec in ENGINES.values()
            if spec.gpu_demo]  # fmt: skip


# What the builds step makes importable: the module an engine row needs beyond torch -> its build (PARTS).
BUILT = {"horovod.torch": "horovod"}


def demo_step(ctx: Context, spec: EngineSpec, gpu_demo: GpuDemo, demo: list[str]) -> Step:
    """``spec``'s demo at np=1 under its launcher, after the build of what it needs; under torchrun its process group
    must be NCCL's."""
    name = f"{spec.name}_demo"
    hvd, ddp = launchers(ctx)
    launcher = {"horovodrun": hvd, "torchrun": ddp, "plain": []}[spec.launcher]  # one process each
    check = checks.check_nccl_training if spec.launcher == "torchrun" else checks.check_training
    return train_step(ctx, name, f"demo job, 1 epoch, {gpu_demo.checks}", launcher, [*demo, "--engine", spec.name],
                      after=(BUILT[spec.needs],) if spec.needs in BUILT else (), check=check,
                      estimate_s=float(ESTIMATES_S.get(name, UNMEASURED_DEMO_S)))  # fmt: skip


def doctor_step(ctx: Context) -> Step:
    hvd, _ = launchers(ctx)
    cmd = [*hvd, ctx.python, "-m", "horovod_train", "doctor"]
    return Step("doctor", "doctor under horovodrun -np 1: device map, NCCL built", cmd, estimate("doctor"),
                check=checks.check_doctor, after=("horovod",))  # fmt: skip


def bench_step(ctx: Context, batch: int, compiled: bool = False) -> Step:
    """`bench gpu`: bert-base-cased, random init, MNLI-like lengths grouped by length, bf16, plain vs Horovod np=1
    in one process (plain alone when the Horovod build failed: the throughput and MFU are still measured)."""
    name = f"bench{'_compile' if compiled else ''}_b{batch}"
    out = ctx.details / "bench" / name
    cmd = [ctx.python, "-m", "horovod_train", "bench", "gpu", "--bf16", "--group_by_length"]
    if ctx.dry:
        cmd += ["--tiny", "--steps", "2", "--warmup", "1", "--repeats", "2"]
    else:
        cmd += ["--steps", "50", "--warmup", "10", "--repeats", "3"]
        cmd += ["--peak_tflops", str(ctx.args.peak_tflops)] if ctx.args.peak_tflops else []  # else by GPU name
    cmd += ["--per_device_train_batch_size", str(batch), "--output_dir", str(out)]
    cmd += ["--torch_compile", "--warmup", "15"] if compiled else []
    what = f"bench gpu bf16 batch {batch}{' torch.compile' if compiled else ''}: throughput, MFU; plain vs Horovod np=1"
    seconds = ESTIMATES_S.get(name, ESTIMATES_S["bench_b128"])  # a dry run's tiny bench: the plumbing
    return Step(name, what, cmd, seconds, check=checks.check_bench, run_dir=out, prepare=plain_without_horovod)


def variants_bench_step(ctx: Context, name: str, what: str, batch: int, model: str, variants: list[str]) -> Step:
    """`bench gpu --variants` (issue 59): the reference engine's step in ``variants`` on ``model``, side by side on
    the same batches: samples/s, real and padded tokens/s, MFU on real tokens, graphs compiled, peak memory, each
    row's last loss. Not in the dry plan: its tiny form is tests/integration/test_bench.py's and
    tests/unit/test_bench.py's (Inductor on the CPU takes minutes)."""
    out = ctx.details / "bench" / name
    cmd = [ctx.python, "-m", "horovod_train", "bench", "gpu", "--bf16", "--group_by_length", "--model", model]
    cmd += ["--engines", reference_engine()]
    cmd += ["--steps", "50", "--warmup", "15", "--repeats", "3", "--length_buckets", "4", "--variants", *variants]
    cmd += ["--peak_tflops", str(ctx.args.peak_tflops)] if ctx.args.peak_tflops else []  # else by GPU name
    cmd += ["--per_device_train_batch_size", str(batch), "--output_dir", str(out)]
    return Step(name, what, cmd, estimate(name), check=checks.check_bench, run_dir=out)


def shapes_bench_step(ctx: Context, batch: int) -> Step:
    """BERT-base's step eager (padded per batch), bucketed (--length_buckets 4), compiled (a graph per bucket),
    compiled with CUDA graphs, and the bucketed step through `train`'s training loop (loop: its ratio to the bare
    bucketed step is what the loop adds, flagged below checks.LOOP_VS_BARE_FLOOR)."""
    what = f"bench gpu bf16 batch {batch}: eager, bucketed, compiled, compiled + CUDA graphs, train's loop (issue 59)"
    variants = ["eager", "bucketed", "compiled", "cudagraphs", "loop"]
    return variants_bench_step(ctx, f"bench_shapes_b{batch}", what, batch, "bert-base-cased", variants)


def decoder_bench_step(ctx: Context, batch: int) -> Step:
    """The padding-free step (issue 59) on a Llama-style 0.5B decoder: eager (padded per batch), bucketed, and the
    examples flattened into one row, its last loss checked against eager's. Not compiled: Inductor on 24 decoder
    layers, a graph per bucket, would take minutes more than the bench itself (BERT-base's 12: 180 s)."""
    what = f"bench gpu decoder-0.5b bf16 batch {batch}: eager, bucketed, padding-free, loss as eager's (issue 59)"
    variants = ["eager", "bucketed", "padding_free"]
    return variants_bench_step(ctx, f"bench_decoder_b{batch}", what, batch, "decoder-0.5b", variants)


def plain_without_horovod(ctx: Context, step: Step) -> None:
    assert step.cmd is not None
    if not ctx.passed("horovod"):
        step.cmd += ["--engines", reference_engine()]
        step.what += " (plain only: no Horovod)"


def plan(ctx: Context, strict: bool = True) -> list[Step]:
    """Every step in value order (the budget cuts from the end), or those --steps names (``strict``: a name it
    does not know is an error; the node's plan shown beside a dry run ignores the dry run's own names)."""
    bert_config, bert_fp16, bert_bf16_ddp = bert_steps(ctx)
    bench = [bench_step(ctx, 8)] if ctx.dry else [bench_step(ctx, 128)]
    steps = [*fact_steps(ctx), builds_step(ctx), collectives_step(ctx), *bench, *equivalence_steps(ctx)]
    steps += [bert_config, bert_fp16, *later_steps(ctx, bert_bf16_ddp)]
    # Issue 59's measurements, past the default budget (six minutes of compiles; the decoder's padding-free step):
    # `--steps bench_shapes_b256,bench_decoder_b256`.
    steps += [] if ctx.dry else [shapes_bench_step(ctx, 256), decoder_bench_step(ctx, 256)]
    if ctx.args.steps:
        known = {s.name for s in steps}
        steps = chosen(steps, [n for n in ctx.args.steps.split(",") if strict or n in known])
    return steps


def later_steps(ctx: Context, bert_bf16_ddp: Step) -> list[Step]:
    """The engines' demos among the check's own later steps (LATER_STEPS), in their order."""
    own = [*([] if ctx.dry else [bench_step(ctx, 256), bench_step(ctx, 128, compiled=True)]), bert_bf16_ddp]
    placed = [(LATER_STEPS[step.name], step) for step in [*own, doctor_step(ctx)]] + demo_steps(ctx)
    return [step for _, step in sorted(placed, key=lambda pair: pair[0])]


PARTS = ("horovod", "horovod_gloo")  # the builds' own entries (their step is "builds")


def chosen(steps: list[Step], wanted: list[str]) -> list[Step]:
    names = [s.name for s in steps]
    unknown = set(wanted) - set(names)
    if unknown:
        raise UsageError(f"unknown step(s) {', '.join(sorted(unknown))}", f"use {names}")
    # a step reading another's files brings it along (equiv_horovod alone would find no model to compare with)
    wanted = [*wanted, *(r for s in steps if s.name in wanted for r in s.reads)]
    kept = [s for s in steps if s.name in wanted]
    for step in kept:  # a step left out is not waited for; the builds stand for their parts
        step.after = tuple(a for a in step.after if a in wanted or (a in PARTS and "builds" in wanted))
    return kept
