"""Same training, provably: every engine under its real launcher ends with the same parameters.

W=2 ranks of per-rank batch b (Horovod with the Gloo and the MPI controller, DDP under torchrun and
mpirun, ZeRO-1 and FSDP under torchrun) against one process with 2b (single, DataParallel), with and without
gradient accumulation (the accumulating runs also recompute their activations: --gradient_checkpointing); see
docs/equivalence.md. The runs without accumulation are one `compare` launch (every engine compare runs by default,
each under its real launcher), whose table, compare.json, logs and chart are checked here too; the accumulating runs
are launched one by one, DDP's under mpirun (its torchrun run is compare's). The sampler test checks the data side
exactly (index sets per global batch). Every compared run also checkpoints half-way, and the fsdp and zero1
checkpoints (sharded) continue at 1 and 4 ranks and under every other engine, and ddp's (whole) under both sharded
engines, to the same parameters (RESUMES); each case is launched once.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from support.jobs import BIN, REPO, assert_ok, horovodrun, launch, mpirun, read_results, run, torchrun, train_here

from horovod_train.gpucheck.checks import EQUIVALENCE_TOLERANCE as TOLERANCE
from horovod_train.gpucheck.steps import EQUIVALENCE_BATCH, EQUIVALENCE_JOB

# 20 steps of tiny-bert, dropout off, Adam's eps 1e-6 (docs/equivalence.md): one job with the GPU check, which
# runs it on a GPU node with two ranks sharing the GPU (horovod_train/gpucheck/steps.py).
JOB = EQUIVALENCE_JOB
B = EQUIVALENCE_BATCH  # per-rank batch of the 2-rank runs
STEPS = int(JOB[JOB.index("--max_steps") + 1])

# The compared runs checkpoint at half-way for the resume tests below (checkpoints change no parameter).
HALF_WAY = ["--save_strategy", "steps", "--save_steps", str(STEPS // 2)]
# Evaluation over uneven shards: 79 examples in batches of 13 are 4 batches on rank 0, 3 on rank 1, which FSDP's
# collective forward must keep in step.
UNEVEN_EVAL = ["--max_eval_samples", "79", "--per_device_eval_batch_size", "13"]
COMPARE = [str(BIN / "python"), "-m", "horovod_train", "compare"]
# The compared runs' final models are split as save_pretrained splits a larger one (tiny-bert's 1.4 MB in 3 files):
# fsdp's gathered a tensor at a time from the shards (engines/pretrained.py), the others' by save_pretrained.
SPLIT = ["--max_shard_size", "500KB"]
INDEX = "model.safetensors.index.json"
# compare's default runs on a CPU machine, in its order: each a case of test_engine_matches_single_process but
# single, which the compare test holds to the others by their losses.
COMPARED_RUNS = ["horovod-gloo", "horovod-mpi", "ddp-gloo", "fsdp-gloo", "zero1-gloo", "single", "dp"]
# case: the compared run that is its 2-rank (or DataParallel) run without accumulation.
COMPARED = {
    "horovod-gloo": "horovod-gloo",  # horovodrun --gloo
    "horovod-mpi": "horovod-mpi",  # mpirun
    "ddp-torchrun": "ddp-gloo",
    "dp": "dp",
    "zero1": "zero1-gloo",
    "fsdp": "fsdp-gloo",  # ZeRO-3: resharded after forward
}
ZERO2 = ["--fsdp_reshard_after_forward", "false"]
HSDP = ["--fsdp_replicate_degree", "2"]  # 4 ranks: 2 replicas x 2 shards, a 2-D mesh
# Saves beside training (--save_async) from step STEPS // 2 on: at 3/4 (its thread writes while training goes on) and
# at the end.
SAVED_ASYNC = ["--save_async", "--save_strategy", "steps", "--save_steps", str(STEPS // 4)]


WRITES_PROBE = REPO / "tests" / "probes" / "written_rows_probe.py"


def torchrun_4(_: int, *args: str) -> list[str]:
    """HSDP's 2 x 2: four ranks where the other cases launch two (each a quarter of the global batch), each recording
    the spans it writes into its checkpoints' model files (tests/probes/written_rows_probe.py)."""
    records = written_spans(Path(args[args.index("--output_dir") + 1]))
    return launch("torchrun", [str(BIN / "python"), str(WRITES_PROBE), str(records), *args], 4)


def written_spans(out: Path) -> Path:
    return out.with_name(f"{out.name}.written")


def assert_each_row_written_once(out: Path, steps: tuple[int, ...], in_background: bool) -> None:
    """HSDP's replicas hold the same shards, which one of them writes: every checkpoint's model file (of the saves at
    ``steps``) got each of its tensors' bytes from exactly one rank (no span written twice, and together the whole
    file after its header), by the save's thread (``in_background``: --save_async) or by training's."""
    by_file: dict[str, list[list[int]]] = {}
    for record in written_spans(out).glob("rank*.json"):
        for file, spans in json.loads(record.read_text()).items():
            by_file.setdefault(file, []).extend(spans)
    names = {Path(file).parent.name.split(".")[1] for file in by_file}
    assert names == {f"checkpoint-{step}" for step in steps}, list(by_file)
    model = out / f"checkpoint-{steps[0]}" / "model.safetensors"
    with model.open("rb") as f:
        tensor_bytes = model.stat().st_size - 8 - int.from_bytes(f.read(8), "little")
    for file, spans in by_file.items():
        spans.sort()
        twice = [(a, b) for a, b in zip(spans, spans[1:], strict=False) if a[0] + a[1] > b[0]]
        assert not twice, f"{file}: {len(twice)} spans written by two ranks, e.g. {twice[:3]}"
        assert sum(size for _, size, _ in spans) == tensor_bytes, file
        assert {bool(background) for _, _, background in spans} == {in_background}, file


RECOMPUTED = "--gradient_checkpointing"
# Each engine's accumulating run also recomputes the activations in backward (--gradient_checkpointing,
# non-reentrant, which DDP's reducer accepts; FSDP gathers a block again for it): neither changes the math, so one
# launch checks both against the single process that stores them. DDP's is the one under mpirun: the launcher sets
# the ranks' rendezvous, the engine accumulates, and each is checked with the other's values elsewhere too.
CASES = {
    "single-accum": (None, "single", B, 2),
    "horovod-gloo-accum-recomputed": (horovodrun, "horovod", B // 2, 2, RECOMPUTED),
    "ddp-mpirun-accum-recomputed": (mpirun, "ddp", B // 2, 2, RECOMPUTED),
    "dp-accum-recomputed": (None, "dp", B, 2, RECOMPUTED),
    "zero1-accum-recomputed": (torchrun, "zero1", B // 2, 2, RECOMPUTED),
    "fsdp-zero2-accum-recomputed": (torchrun, "fsdp", B // 2, 2, *ZERO2, RECOMPUTED),  # ZeRO-2
    # HSDP: gradients reduce-scattered within each replica's 2 ranks, all-reduced across the 2 replicas; it also
    # checkpoints half-way, 2-D DTensors that RESUMES continues under another engine.
    "fsdp-hsdp-2x2": (torchrun_4, "fsdp", B // 2, 1, *HSDP, *HALF_WAY),
}
# The mesh a case's results must report: an option that fell through to plain FSDP would still train the same.
MESHES = {"fsdp-hsdp-2x2": {"replicate": 2, "shard": 2}, "fsdp-as-hsdp-at-4": {"replicate": 2, "shard": 2}}


def check_run(out: Path, engine: str) -> Path:
    results = read_results(out)
    assert results["engine"] == engine and results["global_step"] == STEPS
    assert len(set(results["param_checksum_per_rank"])) == 1, "ranks disagree"
    return out / "model.safetensors"


def train(out: Path, cache_dir: Path, launcher, engine: str, batch: int, accum: int, *extra: str) -> Path:
    args = [*JOB, *extra, "--engine", engine, "--per_device_train_batch_size", str(batch)]
    args += ["--gradient_accumulation_steps", str(accum), "--output_dir", str(out)]
    # One process (single, dp) trains in this one: its numbers are the same (one thread, as a rank's).
    proc = run(launcher(2, *args), cache_dir, timeout=300) if launcher else train_here(cache_dir, *args)
    assert_ok(proc)
    return check_run(out, engine)


def final_weights(path: Path) -> dict[str, torch.Tensor]:
    """A run's final weights: ``path`` (model.safetensors), or the files the index beside it names (a model split
    at --max_shard_size, as compare's runs are)."""
    index = path.parent / "model.safetensors.index.json"
    if not index.is_file():
        return load_file(path)
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return {name: tensor for file in files for name, tensor in load_file(path.parent / file).items()}


def parameter_differences(a: Path, b: Path) -> dict[str, float]:
    x, y = final_weights(a), final_weights(b)
    assert x.keys() == y.keys()
    return {k: (x[k].double() - y[k].double()).abs().max().item() for k in x}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, cache_dir) -> Path:
    """One process, batch 2B, no accumulation: what every other case must reproduce."""
    return train(tmp_path_factory.mktemp("single"), cache_dir, None, "single", 2 * B, 1)


@pytest.fixture(scope="module")
def compared(tmp_path_factory, cache_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """`compare` on the job, launched once: its exit status and output, and its directory (a run's failure is its
    own case's, so nothing is asserted here)."""
    out = tmp_path_factory.mktemp("compared") / "compare"
    args = [*JOB, *HALF_WAY, *UNEVEN_EVAL, *SPLIT, "--per_device_train_batch_size", str(B), "--output_dir", str(out)]
    return run([*COMPARE, *args], cache_dir, timeout=600), out


def compared_run(proc: subprocess.CompletedProcess, out: Path, name: str) -> Path:
    """A compared run's model.safetensors, its row in compare.json ok (else its log is the message)."""
    assert (out / "compare.json").is_file(), f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    (row,) = [r for r in json.loads((out / "compare.json").read_text())["runs"] if r["name"] == name]
    assert row["ok"], Path(row["log"]).read_text()[-4000:]
    return check_run(out / name, row["engine"])


@pytest.fixture(scope="module")
def trained(request, tmp_path_factory, cache_dir) -> Callable[[str], Path]:
    """A case's model.safetensors: a compared run's, or trained once per module (the resume tests read the compared
    sharded runs' checkpoints)."""
    done: dict[str, Path] = {}

    def case_run(case: str) -> Path:
        if case in COMPARED:
            return compared_run(*request.getfixturevalue("compared"), COMPARED[case])
        if case not in done:
            done[case] = train(tmp_path_factory.mktemp(case), cache_dir, *CASES[case])
        return done[case]

    return case_run


@pytest.mark.slow
@pytest.mark.parametrize("case", [*COMPARED, *CASES])
def test_engine_matches_single_process(case, baseline, trained, record_property):
    params = trained(case)
    differences = parameter_differences(baseline, params)
    name = max(differences, key=differences.get)
    difference = differences[name]
    rest = max(v for k, v in differences.items() if not k.endswith("attention.self.key.bias"))
    record_property("max_abs_difference", difference)
    if case in MESHES:
        assert read_results(params.parent)["mesh"] == MESHES[case]
    if case == "fsdp-hsdp-2x2":
        assert_each_row_written_once(params.parent, (STEPS // 2, STEPS), in_background=False)
    message = (
        f"{case} vs single (batch {2 * B}): max-abs parameter difference {difference:.3e} in {name} "
        f"({rest:.3e} over all but the attention key biases)"
    )
    print(message)
    assert difference <= TOLERANCE, message


# fsdp refuses --use_peft (its docstring).
LORA_CASES = {
    "horovod-gloo": (horovodrun, "horovod", B),
    "ddp-torchrun": (torchrun, "ddp", B),
    "zero1-torchrun": (torchrun, "zero1", B),
    "dp": (None, "dp", 2 * B),
}

LORA = ["--use_peft", "--lora_r", "4", "--lora_dropout", "0", "--learning_rate", "2e-3"]


@pytest.fixture(scope="module")
def lora_baseline(tmp_path_factory, cache_dir) -> Path:
    return train(tmp_path_factory.mktemp("single-lora"), cache_dir, None, "single", 2 * B, 1, *LORA)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LORA_CASES))
def test_lora_trains_the_same_adapters_under_every_engine(case, lora_baseline, tmp_path, cache_dir):
    """--use_peft: every engine all-reduces the adapters' and the head's gradients alone, and ends with the
    single process's merged model; the adapter is saved as peft saves it."""
    launcher, engine, batch = LORA_CASES[case]
    params = train(tmp_path / case, cache_dir, launcher, engine, batch, 1, *LORA)
    difference = max(parameter_differences(lora_baseline, params).values())
    print(f"{case} with LoRA vs single with LoRA: max-abs difference of the merged models {difference:.3e}")
    assert difference <= TOLERANCE
    adapter = load_file(params.parent / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k or "modules_to_save" in k or "classifier" in k for k in adapter), list(adapter)


# (the run whose half-way checkpoint is resumed, the launcher (None: one process, in this one), engine, world size
# and per-rank batch that continue it): the global batch stays 2B, which is all a checkpoint asks of a world size.
# fsdp's and zero1's checkpoints are sharded (every rank wrote its part): each continues at 1 and 4 ranks under a
# sharded engine (each rank reads its part, resharded) and under the replicated engines (which read it whole); a
# replicated engine's whole checkpoint continues under both sharded engines. HSDP's (2-D) continues under zero1 on
# one rank, and fsdp's (1-D) on HSDP's 2 x 2 mesh, which saves beside training (SAVED_ASYNC, its rows recorded:
# torchrun_4). 3 ranks: test_checkpoint_resharding. Extra arguments follow.
SHARDED_SOURCES = ("fsdp", "zero1", "fsdp-hsdp-2x2")
RESUMES = {
    "fsdp-under-ddp-on-one-rank": ("fsdp", torchrun, "ddp", 1, 2 * B),
    "fsdp-as-hsdp-at-4": ("fsdp", torchrun_4, "fsdp", 4, B // 2, *HSDP, *SAVED_ASYNC),
    "hsdp-under-zero1-on-one-rank": ("fsdp-hsdp-2x2", torchrun, "zero1", 1, 2 * B),
    "fsdp-under-horovod": ("fsdp", horovodrun, "horovod", 2, B),
    "fsdp-under-single": ("fsdp", None, "single", 1, 2 * B),
    "zero1-at-4": ("zero1", torchrun, "zero1", 4, B // 2),
    "zero1-under-fsdp-on-one-rank": ("zero1", torchrun, "fsdp", 1, 2 * B),
    "zero1-under-dp": ("zero1", None, "dp", 1, 2 * B),
    "ddp-under-fsdp": ("ddp-torchrun", torchrun, "fsdp", 2, B),
    "ddp-under-zero1-at-4": ("ddp-torchrun", torchrun, "zero1", 4, B // 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("resume", list(RESUMES))
def test_a_checkpoint_continues_under_another_engine_or_world_size(resume, baseline, trained, tmp_path, cache_dir):
    """A checkpoint holds the plain model and the optimizer state, whole or sharded, so another engine or world size
    continues it: the end is the single process's, within the tolerance."""
    source, launcher, engine, world, batch, *extra = RESUMES[resume]
    checkpoint = trained(source).parent / f"checkpoint-{STEPS // 2}"
    sharded = (checkpoint / "optimizer" / ".metadata").is_file()
    assert sharded == (source in SHARDED_SOURCES), f"{checkpoint} is {'' if sharded else 'not '}sharded"
    out = tmp_path / resume
    args = [*JOB, *extra, "--engine", engine, "--per_device_train_batch_size", str(batch), "--output_dir", str(out),
            "--resume_from_checkpoint", str(checkpoint)]  # fmt: skip
    proc = run(launcher(world, *args), cache_dir, timeout=300) if launcher else train_here(cache_dir, *args)
    assert_ok(proc)
    assert f"resumed from step {STEPS // 2}" in proc.stdout
    results = read_results(out)
    assert (results["engine"], results["world_size"], results["global_step"]) == (engine, world, STEPS)
    if resume in MESHES:
        assert results["mesh"] == MESHES[resume]
    difference = max(parameter_differences(baseline, out / "model.safetensors").values())
    print(f"{resume}: max-abs parameter difference to single {difference:.3e}")
    assert difference <= TOLERANCE
    if "--save_async" in extra:
        assert_saved_in_background(out)


def assert_saved_in_background(out: Path) -> None:
    """HSDP's saves beside training: each row written once, by the first replica's ranks, in the save's thread; each
    checkpoint whole (its manifest's digests), and the last one's model the run's final model, bit for bit."""
    from horovod_train.outputs.checkpoint import verify_checkpoint

    steps = tuple(range(STEPS // 2 + STEPS // 4, STEPS + 1, STEPS // 4))
    assert_each_row_written_once(out, steps, in_background=True)
    for step in steps:
        assert verify_checkpoint(out / f"checkpoint-{step}")["global_step"] == step
    saved = load_file(out / f"checkpoint-{STEPS}" / "model.safetensors")
    final = final_weights(out / "model.safetensors")
    assert saved.keys() == final.keys() and all(torch.equal(saved[name], final[name]) for name in final)


@pytest.mark.slow
def test_an_fsdp_run_ends_with_a_model_that_from_pretrained_and_a_pipeline_load(trained):
    """Written from the shards a tensor at a time, split at --max_shard_size with transformers' index:
    from_pretrained loads every tensor, and the model is the trained one bit for bit (the ranks' checksum)."""
    from transformers import AutoModelForSequenceClassification, pipeline

    from horovod_train.outputs.checksums import param_checksum

    out = trained("fsdp").parent
    files = set(json.loads((out / INDEX).read_text())["weight_map"].values())
    assert len(files) == 3 and not (out / "model.safetensors").exists(), files
    model, loading = AutoModelForSequenceClassification.from_pretrained(out, output_loading_info=True)
    assert not any(loading.values()), loading
    saved = final_weights(out / "model.safetensors")
    assert all(torch.equal(model.state_dict()[name], tensor) for name, tensor in saved.items())
    assert param_checksum(model) == read_results(out)["param_checksum_per_rank"][0]
    predicted = pipeline("text-classification", model=str(out), device="cpu")("a lamp. a lamp moves.")
    assert predicted[0]["label"] in model.config.label2id


@pytest.mark.slow
def test_compare_runs_every_engine_on_the_same_job(compared):
    """`compare` runs every engine this machine supports under its real launcher with the same global batch, and
    tabulates, saves and plots them."""
    proc, out = compared
    assert_ok(proc)
    report = json.loads((out / "compare.json").read_text())
    runs = report["runs"]
    assert [r["name"] for r in runs] == COMPARED_RUNS and all(r["ok"] for r in runs)
    assert [r["world_size"] for r in runs] == [2, 2, 2, 2, 2, 1, 1] and report["global_batch"] == 2 * B
    assert [len(r["peak_memory_mb_per_rank"]) for r in runs] == [2, 2, 2, 2, 2, 1, 1]
    assert all(m > 50 for r in runs for m in r["peak_memory_mb_per_rank"])
    assert all(r["samples_per_second"] > 0 and r["tokens_per_second"] > 0 for r in runs)
    # The same job: same global batches and gradients, so the same loss and accuracy on every engine.
    losses = [r["final_train_loss"] for r in runs]
    assert max(losses) - min(losses) < 1e-4, losses
    assert len({r["validation_accuracy"] for r in runs}) == 1
    header = "engine        launcher    world  samples/s  tokens/s  train loss  val acc  peak MiB/rank"
    assert header in proc.stdout
    for r in runs:
        assert r["name"] in proc.stdout and (out / r["name"] / INDEX).is_file()
        assert (out / "logs" / f"{r['name']}.log").is_file()
    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Global batch 2 x B on a CPU machine: one process (single, dp) reads batches of 2B.
    for name in ("single", "dp"):
        config = json.loads((out / name / "run_config.json").read_text())
        assert config["per_device_train_batch_size"] == 2 * B and config["engine"] == name
