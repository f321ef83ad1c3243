"""Elastic Horovod: a worker killed mid-epoch leaves the job running on the survivor; a host added
mid-run grows the job back. Two local "hosts" (localhost and 127.0.0.1) stand for two machines.

Two jobs carry two tests each, one event after the other: a job stopped, resumed on another world size and grown;
a job whose hosts file is caught empty, then loses a host.

No test grows a fresh full-model job: two tests cover what it would check. A resumed job grows (the joining worker
takes the job's state from the state sync, as it would a fresh job's), and a fresh LoRA job grows (the adapters, the
head and the optimizer's state from the state sync)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from support.jobs import BIN, REPO, SMALL_JOB, base_env, read_results, train_cmd
from support.processes import find_rank_process, wait_for

pytestmark = pytest.mark.slow

JOB = [
    *SMALL_JOB,
    "--synthetic_num_examples",
    "3000",
    "--num_train_epochs",
    "2",
    "--elastic",
    "--elastic_commit_steps",
    "5",
    "--audit_samples",
    "--logging_steps",
    "10",
]


# launch/discover_hosts.sh, each call's exit status appended to $HVT_DISCOVERY_LOG: what discovery saw, for a test to
# wait on.
DISCOVERY = Path(__file__).parents[1] / "probes" / "logged_discovery.sh"


def discovery_failures(tmp_path: Path) -> int:
    log = tmp_path / "discovery.log"
    return sum(line != "0" for line in log.read_text().splitlines()) if log.exists() else 0


def start_elastic(
    tmp_path: Path, cache_dir: Path, hosts: list[str], np: int, out: Path, *extra: str
) -> subprocess.Popen:
    hosts_file = write_hosts(tmp_path, hosts)
    # Horovod's info log says "Horovod initialized" at each (re)initialisation: how a test counts resets.
    env = {**base_env(cache_dir), "HVT_HOSTS_FILE": str(hosts_file), "HOROVOD_LOG_LEVEL": "info"}
    env["HVT_DISCOVERY_LOG"] = str(tmp_path / "discovery.log")
    cmd = [
        str(BIN / "horovodrun"),
        "-np",
        str(np),
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--host-discovery-script",
        str(DISCOVERY),
        # Named interfaces: otherwise horovodrun waits for 2 hosts to find common ones, even at -np 1.
        "--network-interfaces",
        "lo",
        *train_cmd(*JOB, "--output_dir", str(out), *extra),
    ]
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def write_hosts(tmp_path: Path, hosts: list[str]) -> Path:
    """Replace the hosts file at once, as a scheduler's hook should: horovodrun reads it every second, and a
    file caught between truncate and write lists no host."""
    hosts_file, tmp = tmp_path / "hosts.txt", tmp_path / ".hosts.txt.tmp"
    tmp.write_text("".join(f"{h}\n" for h in hosts))
    os.replace(tmp, hosts_file)
    return hosts_file


def add_a_host(tmp_path: Path, out: Path) -> None:
    """Add 127.0.0.1 to the hosts file of a job running on localhost alone, and hold that worker back until a worker
    has started on the added host. Horovod's driver starts it only once the running worker has taken the change at
    a commit, and the run must not end first: on loaded cores its last steps outran discovery and notification
    (CI of 343da09: world sizes [2, 1], no growth). Until then the running worker runs a fifth of the time (SIGSTOP,
    SIGCONT), as on a slower machine: its steps come later, none changes."""
    worker = wait_for(lambda: find_rank_process(out, "HOROVOD_HOSTNAME", "localhost"), 30, "the running worker")
    write_hosts(tmp_path, ["localhost:1", "127.0.0.1:1"])
    deadline = time.monotonic() + 240
    try:
        while not find_rank_process(out, "HOROVOD_HOSTNAME", "127.0.0.1") and time.monotonic() < deadline:
            os.kill(worker, signal.SIGSTOP)
            time.sleep(0.2)
            os.kill(worker, signal.SIGCONT)
            time.sleep(0.05)
    except ProcessLookupError:
        pass  # the run ended without the added host: the caller's world sizes say so
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGCONT)


def last_logged_step(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return int(lines[-1].split('"step": ')[1].split(",")[0]) if lines else 0


def finish(job: subprocess.Popen, timeout: float) -> str:
    try:
        output, _ = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        output, _ = job.communicate()
        pytest.fail(f"elastic job did not finish in {timeout}s:\n{output[-4000:]}")
    return output


def completed_run(job: subprocess.Popen, out: Path) -> tuple[dict, list[int], str]:
    """Wait for the job; return its results, the world sizes it went through and its output."""
    output = finish(job, 400)
    assert job.returncode == 0, output[-4000:]
    results = read_results(out)
    print(f"world size over the run: {results['world_size_changes']}; epochs: {results['history']}")
    check_epochs_covered_every_example(results)
    return results, [size for _, size in results["world_size_changes"]], output


def check_epochs_covered_every_example(results: dict) -> None:
    for entry in results["history"]:
        audit = entry["samples"]
        assert audit["skipped"] == 0, entry
        # Only the sampler's end-of-epoch padding repeats (fewer examples than ranks).
        assert audit["repeated"] < 2, entry


def stop_after(tmp_path: Path, cache_dir: Path, hosts: list[str], out: Path, steps: int) -> int:
    """Start an elastic job on ``hosts``, SIGTERM it after ``steps`` steps; the step it checkpointed."""
    job = start_elastic(tmp_path, cache_dir, hosts, len(hosts), out)
    try:
        wait_for(lambda: last_logged_step(out) >= steps, 240, f"{steps} steps on {len(hosts)} worker(s)")
        os.killpg(job.pid, signal.SIGTERM)
        output = finish(job, 120)
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    stopped = re.search(r"stopped by SIGTERM at step (\d+): saved checkpoint-\1", output)
    assert stopped, output[-4000:]
    return int(stopped[1])


def test_killed_worker_leaves_the_job_running_on_the_survivor(tmp_path, cache_dir):
    """One epoch, the kill inside it: a second one would train on the survivor alone."""
    out = tmp_path / "run"
    job = start_elastic(tmp_path, cache_dir, ["localhost:1", "127.0.0.1:1"], 2, out, "--num_train_epochs", "1")
    try:
        wait_for(lambda: last_logged_step(out) >= 30, 240, "30 steps on 2 workers")
        victim = wait_for(lambda: find_rank_process(out, "HOROVOD_HOSTNAME", "127.0.0.1"), 30, "the 127.0.0.1 worker")
        os.kill(victim, signal.SIGKILL)
        write_hosts(tmp_path, ["localhost:1"])
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    results, sizes, output = completed_run(job, out)
    assert sizes == [2, 1] and results["world_size"] == 1, output[-6000:]


def grow_from_one_worker_to_two(tmp_path: Path, cache_dir: Path, out: Path, *extra: str) -> dict:
    """Start on one host, add a second after 20 steps; the results of a run that went from 1 to 2 workers
    and ended with the same parameters on both."""
    job = start_elastic(tmp_path, cache_dir, ["localhost:1"], 1, out, *extra)
    try:
        wait_for(lambda: last_logged_step(out) >= 20, 240, "20 steps on 1 worker")
        add_a_host(tmp_path, out)
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    results, sizes, output = completed_run(job, out)
    assert sizes == [1, 2] and results["world_size"] == 2, output[-6000:]
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]
    return results


@pytest.fixture(scope="module")
def stopped_resumed_and_grown(tmp_path_factory, cache_dir) -> tuple[int, dict, str]:
    """One job for two tests: SIGTERM to 2 workers after 30 steps, `auto` resumes it on one worker, and 10 steps
    later a host is added. The step it stopped at, its results and the resumed job's output."""
    home = tmp_path_factory.mktemp("stopped-resumed-grown")
    out = home / "run"
    stopped = stop_after(home, cache_dir, ["localhost:1", "127.0.0.1:1"], out, steps=30)
    job = start_elastic(home, cache_dir, ["localhost:1"], 1, out, "--resume_from_checkpoint", "auto")
    try:
        wait_for(lambda: last_logged_step(out) >= stopped + 10, 240, "10 more steps on 1 worker")
        add_a_host(home, out)
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    results, _, output = completed_run(job, out)
    assert f"resumed from step {stopped}" in output
    return stopped, results, output


def test_stopped_elastic_job_resumes_on_another_world_size(stopped_resumed_and_grown):
    """SIGTERM to a 2-worker elastic job: checkpoint at the next step; `auto` resumes it on one worker. The
    elastic sampler re-shards the rest of the epoch by examples seen, so each epoch still covers every
    example once (the audit spans the stop)."""
    stopped, results, _ = stopped_resumed_and_grown
    changes = results["world_size_changes"]
    assert [size for _, size in changes[:2]] == [2, 1] and changes[1][0] == stopped, changes
    assert [entry["epoch"] for entry in results["history"]] == [1, 2]


def test_resumed_elastic_job_grows_when_a_host_is_added(stopped_resumed_and_grown):
    """A worker added to a resumed elastic job used to broadcast the checkpoint from its setup while the
    running worker was inside Horovod's state sync: both hung. It takes the job's state when it joins."""
    _, results, _ = stopped_resumed_and_grown
    sizes = [size for _, size in results["world_size_changes"]]
    assert sizes == [2, 1, 2] and results["world_size"] == 2, results["world_size_changes"]
    assert results["param_checksum_per_rank"][0] == results["param_checksum_per_rank"][1]


@pytest.fixture(scope="module")
def emptied_then_shrunk(tmp_path_factory, cache_dir) -> tuple[dict, str, int]:
    """One 2-worker job for two tests: after 30 steps its hosts file is caught empty by discovery and written whole
    again; 10 logged steps later (past a commit, where a reset the empty file caused would come) 127.0.0.1 is taken
    out of it. Its results, its output and the step logged when the host was removed."""
    home = tmp_path_factory.mktemp("emptied-then-shrunk")
    out = home / "run"
    hosts = ["localhost:1", "127.0.0.1:1"]
    job = start_elastic(home, cache_dir, hosts, 2, out)
    try:
        wait_for(lambda: last_logged_step(out) >= 30, 240, "30 steps on 2 workers")
        write_hosts(home, [])
        wait_for(lambda: discovery_failures(home), 60, "a discovery that found the hosts file empty")
        write_hosts(home, hosts)
        restored = last_logged_step(out)
        wait_for(lambda: last_logged_step(out) >= restored + 10, 240, "10 more steps on 2 workers")
        removed_at = last_logged_step(out)
        write_hosts(home, ["localhost:1"])
    except BaseException:
        os.killpg(job.pid, signal.SIGKILL)
        raise
    results, _, output = completed_run(job, out)
    return results, output, removed_at


def test_a_hosts_file_caught_empty_does_not_reset_the_job(emptied_then_shrunk):
    """A hosts file caught empty while it is rewritten used to be discovered as "no hosts": the driver told every
    worker that its host was removed, and the job reset and rolled back to its last commit (then grew again when the
    file was whole). Discovery now fails on an empty file, which the driver retries: nothing happens. The one reset
    is the removal's that comes later."""
    results, output, removed_at = emptied_then_shrunk
    changes = results["world_size_changes"]
    assert len(changes) == 2 and changes[1][0] >= removed_at, (removed_at, changes)
    # The worker on localhost, which trains to the end; either host's worker may have started as rank 0.
    survivor = re.findall(r"^(\[\d+\])<stdout>:", output, re.MULTILINE)[-1]
    initialised = re.findall(rf"^{re.escape(survivor)}<stdout>:.*Horovod initialized", output, re.MULTILINE)
    assert len(initialised) == 2, (
        f"the surviving worker initialised Horovod {len(initialised)} times, not at the start and at the removal:\n"
        f"{output[-4000:]}"
    )


def test_a_host_removed_from_the_file_shrinks_the_job_without_repeating_examples(emptied_then_shrunk):
    """A scheduler that takes a host back edits the hosts file: Horovod interrupts the workers with a "removed"
    update and re-enters the loop without syncing the state (skip_sync). The survivor's sampler then listed the
    whole epoch again (its unprocessed indices are recomputed only when its state is loaded): 1760 examples of
    2700 trained twice. The audit (completed_run) checks that each epoch covered every example once."""
    results, _, _ = emptied_then_shrunk
    sizes = [size for _, size in results["world_size_changes"]]
    assert sizes == [2, 1] and results["world_size"] == 1, results["world_size_changes"]


def test_a_lora_job_grows_when_a_host_is_added(tmp_path, cache_dir):
    """--use_peft under elastic Horovod: the joining worker takes the adapters, the head and the optimizer
    state from the state sync (the frozen base comes from the same init on every worker). 3 epochs, more than the
    full model's 2 (a LoRA step is not much cheaper on tiny-bert): the job must outlast the second worker's start
    (at 4 epochs it joined at step 130 of about 600 under load; 3 leave about 500)."""
    out = tmp_path / "run"
    grow_from_one_worker_to_two(tmp_path, cache_dir, out, "--use_peft", "--num_train_epochs", "3")
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
