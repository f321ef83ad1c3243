"""DDP's gradient buckets as bench forms them (bench/buckets.py, with DDP's own assignment: bench allreduce reduces
them, bench project times them) against the buckets a real DistributedDataParallel rebuilds (Gloo, one rank)."""

from __future__ import annotations

import json
import subprocess

import pytest
from support.jobs import BIN, REPO, base_env

from horovod_train.bench import buckets

# One rank is enough: DDP forms its buckets the same way at any world size. After the first backward
# it rebuilds them in the order the gradients became ready; that is what every later step reduces.
PROBE = r"""
import json, sys, torch, torch.distributed as dist
store, caps = sys.argv[1], json.loads(sys.argv[2])
dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
widths = (300, 700, 200, 900, 100, 600, 1200, 400)  # tensors from 0.4 KiB to 4.6 MiB
model = torch.nn.Sequential(*[torch.nn.Linear(a, b) for a, b in zip(widths, widths[1:])])
found = {}
for cap in caps:
    ddp = torch.nn.parallel.DistributedDataParallel(model, **({} if cap is None else {"bucket_cap_mb": cap}))
    for _ in range(3):  # the logger records the rebuilt buckets from the second step on
        ddp(torch.randn(2, widths[0])).sum().backward()
    sizes = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"]
    found[json.dumps(cap)] = [int(s) for s in sizes.split(",")]
print(json.dumps({"tensor_bytes": [4 * p.numel() for p in model.parameters()], "buckets": found}))
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def torch_buckets(tmp_path_factory, cache_dir) -> dict:
    caps = [None, 25, 2, 0.5]  # torch's default, the ddp engine's default, two that split the model
    store = tmp_path_factory.mktemp("ddp-store") / "store"
    cmd = [str(BIN / "python"), "-c", PROBE, str(store), json.dumps(caps)]
    proc = subprocess.run(cmd, cwd=REPO, env=base_env(cache_dir), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("cap_mb", [None, 25, 2, 0.5])
def test_the_bucket_model_is_ddps_own(torch_buckets, cap_mb):
    modelled = [nbytes for _, nbytes in buckets.ddp_buckets(torch_buckets["tensor_bytes"], cap_mb)]
    assert modelled == torch_buckets["buckets"][json.dumps(cap_mb)]


def test_the_probe_model_splits_into_several_buckets(torch_buckets):
    """Else the comparison above could not tell a first-bucket rule from another."""
    assert len(torch_buckets["buckets"]["null"]) > 1 and len(torch_buckets["buckets"]["0.5"]) > 2
