"""The launch/ scripts on this machine: shellcheck, one-line input errors, and real 2-rank trainings through
launch/horovodrun_local.sh and launch/mpirun.sh with Horovod knobs passed through to the ranks."""

from __future__ import annotations

import os

import pytest
from horovod.runner.elastic.discovery import HostDiscoveryScript
from support.jobs import REPO
from support.launch import (
    LAUNCH,
)

SHELL_SCRIPTS = sorted(
    str(path.relative_to(REPO))
    for pattern in ("launch/*.sh", "launch/slurm/*.sh", "launch/slurm/*.sbatch", "scripts/*.sh", "docker/*.sh")
    for path in REPO.glob(pattern)
)


def test_launch_scripts_are_executable() -> None:
    sourced = {"launch/lib.sh", "launch/ranks.sh", "launch/slurm/common.sh"}
    not_executable = [name for name in SHELL_SCRIPTS if name not in sourced and not os.access(REPO / name, os.X_OK)]
    assert not not_executable


def test_discovery_script_follows_edits_of_the_hosts_file(tmp_path, monkeypatch) -> None:
    """Horovod's own elastic discovery reads the script; an edit while a job runs changes the answer."""
    hosts = tmp_path / "hosts.txt"
    monkeypatch.setenv("HVT_HOSTS_FILE", str(hosts))
    discovery = HostDiscoveryScript(str(LAUNCH / "discover_hosts.sh"), slots=1)
    hosts.write_text("# elastic pool\nnode1:2\n")
    assert discovery.find_available_hosts_and_slots() == {"node1": 2}
    hosts.write_text("# elastic pool\nnode1:2\nnode2 slots=4   # added while running\n\n")
    assert discovery.find_available_hosts_and_slots() == {"node1": 2, "node2": 4}
    hosts.write_text("node2:4\n")
    assert discovery.find_available_hosts_and_slots() == {"node2": 4}
    hosts.write_text("node2:4\nnode3:lots\n")
    with pytest.raises(RuntimeError, match="discovery script"):
        discovery.find_available_hosts_and_slots()
    # A file being rewritten (truncated, not yet filled) is a failed discovery, which Horovod's driver retries,
    # not an empty answer, which it reads as "every host removed".
    hosts.write_text("")
    with pytest.raises(RuntimeError, match="discovery script"):
        discovery.find_available_hosts_and_slots()
