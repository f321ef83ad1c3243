"""The programs the GPU check's steps run (``python -m horovod_train.gpucheck.node COMMAND``): they import torch,
Horovod and transformers, so they run in the steps' own processes, never in the check, which starts before
the dependencies are installed (tests/unit/test_layout.py keeps the two apart).

  environment   the facts a first run on a new node needs, printed before anything can fail: Python (its
                Python.h, distutils, whether pip can write), torch, CUDA, NCCL, the GPU, the tools a Horovod
                build needs, the packages the check depends on; JSON on the last line
  collectives   Horovod's allreduce/allgather/broadcast on this rank's device for every dtype the suite sends:
                exact results or exit 1 (NCCL at np=1 on a GPU: NCCL refuses two ranks on one GPU)
  bert-config   bert-base-cased's architecture as a config folder, for `train --config_name` (random init)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

# What the training and the check depend on beyond the standard library: their versions on this node.
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub", "datasets", "evaluate",
            "pyarrow", "pandas", "fsspec", "dill", "multiprocess", "xxhash", "numpy", "scikit-learn", "scipy",
            "matplotlib", "pyyaml", "psutil", "cloudpickle", "packaging", "setuptools", "wheel", "pip", "cmake",
            "mpi4py", "nvidia-nccl-cu13", "horovod")  # fmt: skip
GPU_QUERY = "name,compute_cap,memory.total,driver_version,clocks.max.sm,power.limit"


def first_line(cmd: list[str]) -> str:
    """The first line a tool prints about itself, or why there is none."""
    if not shutil.which(cmd[0]):
        return "not found"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    return lines[0].strip() if lines else f"exit {out.returncode}"


def python_facts() -> dict[str, Any]:
    """What a Horovod build on this Python needs: Python.h where distutils says (Horovod's CMake asks it, and
    Python 3.12 has distutils only through setuptools), and a site-packages pip can write into."""
    facts: dict[str, Any] = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "venv": sys.prefix != sys.base_prefix,
        "site_packages_writable": os.access(sysconfig.get_paths()["purelib"], os.W_OK),
        "sysconfig_include": sysconfig.get_paths()["include"],
    }
    try:
        from distutils.sysconfig import get_python_inc  # setuptools' shim on 3.12 (its distutils-precedence.pth)

        facts["distutils_include"] = get_python_inc()
    except Exception as exc:  # noqa: BLE001 (any failure here is the fact to report)
        facts["distutils_include"] = f"not importable: {exc}"
    found = [Path(str(facts[key])) / "Python.h" for key in ("distutils_include", "sysconfig_include")]
    facts["python_h"] = next((str(path) for path in found if path.is_file()), "missing")
    return facts


def torch_facts() -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": []}
    if torch.cuda.is_available():
        facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        facts["cudnn"] = torch.backends.cudnn.version()
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            facts["gpus"].append({"name": props.name, "capability": f"{props.major}.{props.minor}",
                                  "memory_gib": round(props.total_memory / 2**30, 1),
                                  "multiprocessors": props.multi_processor_count})  # fmt: skip
        facts["bf16"] = torch.cuda.is_bf16_supported()
    return facts


def horovod_facts() -> dict[str, Any]:
    try:
        import horovod
        import horovod.torch as hvd
    except Exception as exc:  # noqa: BLE001 (not built yet, or built wrong: either is the fact)
        return {"horovod": f"not importable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"}
    return {"horovod": horovod.__version__, "horovod_nccl_built": bool(hvd.nccl_built()),
            "horovod_mpi_built": bool(hvd.mpi_built()), "horovod_gloo_built": bool(hvd.gloo_built())}  # fmt: skip


def version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def machine_facts() -> dict[str, Any]:
    memory = next((line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:")), "0")  # fmt: skip
    return {
        "cpus": os.cpu_count(),
        "memory_gib": round(int(memory) / 2**20, 1),
        "disk_free_gib": round(shutil.disk_usage(Path.cwd()).free / 2**30, 1),
        "nvidia_smi": first_line(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader"]),
        "nvcc": nvcc_release(),
        "cmake": first_line(["cmake", "--version"]),
        "cxx": first_line(["c++", "--version"]),
        "mpicxx": shutil.which("mpicxx") or "not found",
    }


def nvcc_release() -> str:
    if not shutil.which("nvcc"):
        return "not found"
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=60).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), "unknown")


def environment() -> int:
    facts = {**python_facts(), **machine_facts(), **torch_facts(), **horovod_facts()}
    facts["packages"] = {name: version(name) for name in PACKAGES}
    shown = {**{k: v for k, v in facts.items() if k != "packages"}, **facts["packages"]}
    width = max(map(len, shown))
    for key, value in shown.items():
        print(f"{key:<{width}}  {value}")
    print(json.dumps(facts))
    return 0


DTYPES = ("float32", "float16", "int64", "float64", "uint8")


def collectives(require_cuda: bool) -> int:
    """Horovod's collectives on this rank's device, for every dtype the suite sends (fp32 gradients and metrics,
    fp16 compression, int64 lengths and checksums, float64 sums, uint8 payloads: gathered and broadcast only,
    Horovod all-reduces no uint8): exact results or exit 1."""
    import horovod.torch as hvd
    import torch

    hvd.init()
    cuda = torch.cuda.is_available()
    if require_cuda and not cuda:
        print("error: no CUDA device; fix: run on a GPU node", file=sys.stderr)
        return 1
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    results = {name: dtype_collectives(hvd, torch, getattr(torch, name), device) for name in DTYPES}
    report = {"device": str(device), "size": hvd.size(), "nccl_built": bool(hvd.nccl_built()), "ops": results}
    print(json.dumps(report))
    return 0 if all(all(ops.values()) for ops in results.values()) else 1


def dtype_collectives(hvd: Any, torch: Any, dtype: Any, device: Any) -> dict[str, bool]:
    name = str(dtype).removeprefix("torch.")
    base = torch.arange(6) % 5
    mine = (base + hvd.rank()).to(device=device, dtype=dtype)
    gathered = hvd.allgather(mine, name=f"check.gather.{name}")
    received = mine.clone() if hvd.rank() == 0 else torch.zeros_like(mine)
    hvd.broadcast_(received, root_rank=0, name=f"check.broadcast.{name}")
    everyone = torch.cat([(base + r).to(dtype) for r in range(hvd.size())])
    results = {
        "allgather": gathered.device == device and torch.equal(gathered.cpu(), everyone),
        "broadcast": torch.equal(received.cpu(), base.to(dtype)),
    }
    if dtype != torch.uint8:
        total = sum(base + r for r in range(hvd.size())).to(dtype)
        summed = hvd.allreduce(mine, op=hvd.Sum, name=f"check.sum.{name}")
        results["allreduce"] = summed.device == device and summed.dtype == dtype and torch.equal(summed.cpu(), total)
    return results


def bert_config(folder: Path) -> int:
    from transformers import BertConfig

    from horovod_train.models.model import BERT_BASE_CASED

    BertConfig(**BERT_BASE_CASED).save_pretrained(folder)
    print(f"saved bert-base-cased's configuration to {folder} (train --config_name: random init)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m horovod_train.gpucheck.node", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("environment")
    commands.add_parser("collectives").add_argument("--require-cuda", action="store_true")
    commands.add_parser("bert-config").add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    if args.command == "environment":
        return environment()
    if args.command == "collectives":
        return collectives(args.require_cuda)
    return bert_config(args.folder)


if __name__ == "__main__":
    sys.exit(main())
