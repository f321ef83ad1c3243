"""`make setup` installs torch's CPU build where there is no GPU (scripts/torch_index.py, issue 58): the decision,
with a stand-in nvidia-smi on PATH (no download: pip's answer is an argument)."""

from __future__ import annotations

import importlib.util

import pytest
from support.jobs import REPO

spec = importlib.util.spec_from_file_location("torch_index", REPO / "scripts" / "torch_index.py")
torch_index = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torch_index)
CPU = torch_index.CPU_INDEX


def fake_nvidia_smi(folder, exit_code: int, listed: str) -> str:
    tool = folder / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\necho '{listed}'\nexit {exit_code}\n")
    tool.chmod(0o755)
    return str(folder)


@pytest.mark.parametrize(
    ("tool", "visible"),
    [(None, False), ((0, "GPU 0: NVIDIA H200 (UUID: GPU-1)"), True), ((9, "NVIDIA-SMI has failed"), False)],
)
def test_a_gpu_is_one_nvidia_smi_lists(tool, visible, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, *tool) if tool else str(tmp_path))
    assert torch_index.gpu_visible() is visible


def test_no_gpu_and_a_cuda_build_by_default_takes_the_cpu_index():
    assert torch_index.choose(None, gpu=False, version="2.13.0")[0] == CPU
    assert torch_index.choose(None, gpu=True, version=None)[0] == ""
    # this machine's case: the default index (a local wheel) already has the CPU build, or pip cannot tell
    assert torch_index.choose(None, gpu=False, version="2.13.0+cpu")[0] == ""
    assert torch_index.choose(None, gpu=False, version=None)[0] == ""
    assert torch_index.choose("https://mirror/whl/cu126", gpu=False, version=None)[0] == "https://mirror/whl/cu126"
    assert torch_index.choose("", gpu=False, version="2.13.0")[0] == ""


def test_the_override_asks_neither_nvidia_smi_nor_pip(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path, 0, "GPU 0: NVIDIA H200"))
    monkeypatch.setenv("TORCH_INDEX_URL", CPU)
    torch_index.main(str(tmp_path / "no-python"), "torch==2.13.0")
    assert capsys.readouterr().out.splitlines() == [CPU, f"torch from {CPU} (TORCH_INDEX_URL)"]
