"""Same training, provably: every engine under its real launcher ends with the same parameters.

W=2 ranks of per-rank batch b (Horovod with the Gloo and the MPI controller, DDP under torchrun and
mpirun) against one process with 2b (single, DataParallel), with and without gradient accumulation;
see docs/equivalence.md. The sampler test checks the data side exactly (index sets per global batch).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file
from support.jobs import assert_ok, horovodrun, mpirun, read_results, run, torchrun, train_cmd

from horovod_train.gpucheck.checks import EQUIVALENCE_TOLERANCE as TOLERANCE
from horovod_train.gpucheck.steps import EQUIVALENCE_BATCH, EQUIVALENCE_JOB

# 20 steps of tiny-bert, dropout off, Adam's eps 1e-6 (docs/equivalence.md): one job with the GPU check, which
# runs it on a GPU node with two ranks sharing the GPU (horovod_train/gpucheck/steps.py).
JOB = EQUIVALENCE_JOB
B = EQUIVALENCE_BATCH  # per-rank batch of the 2-rank runs
STEPS = int(JOB[JOB.index("--max_steps") + 1])

CASES = {
    "horovod-gloo": (horovodrun, "horovod", B, 1),
    "horovod-mpi": (mpirun, "horovod", B, 1),
    "ddp-torchrun": (torchrun, "ddp", B, 1),
    "ddp-mpirun": (mpirun, "ddp", B, 1),
    "dp": (None, "dp", 2 * B, 1),
    "single-accum": (None, "single", B, 2),
    "horovod-gloo-accum": (horovodrun, "horovod", B // 2, 2),
    "ddp-torchrun-accum": (torchrun, "ddp", B // 2, 2),
    "dp-accum": (None, "dp", B, 2),
}


def train(out: Path, cache_dir: Path, launcher, engine: str, batch: int, accum: int, *extra: str) -> Path:
    args = [*JOB, *extra, "--engine", engine, "--per_device_train_batch_size", str(batch)]
    args += ["--gradient_accumulation_steps", str(accum), "--output_dir", str(out)]
    proc = run(launcher(2, *args) if launcher else train_cmd(*args), cache_dir, timeout=300)
    assert_ok(proc)
    results = read_results(out)
    assert results["engine"] == engine and results["global_step"] == STEPS
    assert len(set(results["param_checksum_per_rank"])) == 1, "ranks disagree"
    return out / "model.safetensors"


def parameter_differences(a: Path, b: Path) -> dict[str, float]:
    x, y = load_file(a), load_file(b)
    assert x.keys() == y.keys()
    return {k: (x[k].double() - y[k].double()).abs().max().item() for k in x}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, cache_dir) -> Path:
    """One process, batch 2B, no accumulation: what every other case must reproduce."""
    return train(tmp_path_factory.mktemp("single"), cache_dir, None, "single", 2 * B, 1)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_engine_matches_single_process(case, baseline, tmp_path, cache_dir, record_property):
    params = train(tmp_path / case, cache_dir, *CASES[case])
    differences = parameter_differences(baseline, params)
    name = max(differences, key=differences.get)
    difference = differences[name]
    rest = max(v for k, v in differences.items() if not k.endswith("attention.self.key.bias"))
    record_property("max_abs_difference", difference)
    message = (
        f"{case} vs single (batch {2 * B}): max-abs parameter difference {difference:.3e} in {name} "
        f"({rest:.3e} over all but the attention key biases)"
    )
    print(message)
    assert difference <= TOLERANCE, message


MEMORY_CASES = {
    "horovod-gloo": (horovodrun, "horovod", B),
    "ddp-torchrun": (torchrun, "ddp", B),
    "dp": (None, "dp", 2 * B),
}

LORA = ["--use_peft", "--lora_r", "4", "--lora_dropout", "0", "--learning_rate", "2e-3"]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_gradient_checkpointing_learns_what_storing_the_activations_learns(case, baseline, tmp_path, cache_dir):
    """Recomputing the activations in the backward pass (non-reentrant, which DDP's reducer accepts) gives the
    parameters of the run that stored them, under every engine."""
    launcher, engine, batch = MEMORY_CASES[case]
    params = train(tmp_path / case, cache_dir, launcher, engine, batch, 1, "--gradient_checkpointing")
    difference = max(parameter_differences(baseline, params).values())
    print(f"{case} with --gradient_checkpointing vs single without: max-abs parameter difference {difference:.3e}")
    assert difference <= TOLERANCE


@pytest.fixture(scope="module")
def lora_baseline(tmp_path_factory, cache_dir) -> Path:
    return train(tmp_path_factory.mktemp("single-lora"), cache_dir, None, "single", 2 * B, 1, *LORA)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(MEMORY_CASES))
def test_lora_trains_the_same_adapters_under_every_engine(case, lora_baseline, tmp_path, cache_dir):
    """--use_peft: every engine all-reduces the adapters' and the head's gradients alone, and ends with the
    single process's merged model; the adapter is saved as peft saves it."""
    launcher, engine, batch = MEMORY_CASES[case]
    params = train(tmp_path / case, cache_dir, launcher, engine, batch, 1, *LORA)
    difference = max(parameter_differences(lora_baseline, params).values())
    print(f"{case} with LoRA vs single with LoRA: max-abs difference of the merged models {difference:.3e}")
    assert difference <= TOLERANCE
    adapter = load_file(params.parent / "adapter" / "adapter_model.safetensors")
    assert adapter and all("lora_" in k or "modules_to_save" in k or "classifier" in k for k in adapter), list(adapter)
