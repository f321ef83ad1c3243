"""launch/k8s/: the Kubernetes templates rendered with typical values and validated, without a cluster, against
the openAPIV3Schema of the operators' published CRDs (tests/data/k8s_crds/, README there), made strict
(an unknown field is an error, not silently pruned); then what the schema cannot say: the pods run our entry
points with --resume_from_checkpoint auto, the grace period, the PVC at the output directory, GPUs when asked.
The renderer refuses bad values in one line; launch/k8s/pod.sh turns a pod's SIGTERM into a checkpoint, for
real, under torchrun and a single process; the restarted torchrun pod resumes from it, and so does the single
process's checkpoint (in the test process)."""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.jobs import BIN, REPO, SMALL_JOB, base_env, train_here
from support.launch import free_port

from horovod_train.outputs import checkpoint as ckpt
from horovod_train.outputs.run_directory import RunDirectory

K8S = REPO / "launch" / "k8s"
CRDS = REPO / "tests" / "data" / "k8s_crds"
RENDER = [sys.executable, str(K8S / "render.py")]
TEMPLATES = {
    "mpijob-horovodrun.yaml": "kubeflow.org_mpijobs.yaml",
    "mpijob-mpirun.yaml": "kubeflow.org_mpijobs.yaml",
    "pytorchjob-ddp.yaml": "kubeflow.org_pytorchjobs.yaml",
}
BASE = {"NAME": "bert-glue", "IMAGE": "registry.example.com/horovod-train:gpu", "PVC": "shared-runs"}
VALUE_SETS = {
    "gpu-2x8": {
        **BASE,
        "WORKERS": "2",
        "GPUS_PER_WORKER": "8",
        "GRACE_SECONDS": "600",
        "TRAIN_ARGS": "--config configs/demo.yaml --bf16 --max_steps 1000",
    },
    "cpu-1x2": {**BASE, "WORKERS": "1", "GPUS_PER_WORKER": "0", "PROCS_PER_WORKER": "2"},
    "defaults": dict(BASE),
}


def render(template: str, values: dict[str, str]) -> subprocess.CompletedProcess[str]:
    words = [f"{k}={v}" for k, v in values.items()]
    return subprocess.run([*RENDER, str(K8S / template), *words], capture_output=True, text=True, timeout=60)


def rendered(template: str, values: dict[str, str]) -> dict[str, Any]:
    return yaml.safe_load(_rendered_text(template, tuple(values.items())))


@functools.cache
def _rendered_text(template: str, values: tuple[tuple[str, str], ...]) -> str:
    """Rendered once per module for the tests that read the same template with the same values."""
    proc = render(template, dict(values))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def strict(schema: Any) -> Any:
    """The schema with additionalProperties: false on every object that lists its properties (the API server
    prunes unknown fields of a structural schema: a misspelt field would vanish without a word)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


@functools.cache
def _crd(crd_file: str) -> dict[str, Any]:
    """Parsed once per module (600 KB of YAML: 0.6 s of CPU each time in pure Python)."""
    return yaml.load((CRDS / crd_file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def crd_schema(crd_file: str, api_version: str, kind: str) -> dict[str, Any]:
    crd = _crd(crd_file)
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = copy.deepcopy(served["schema"]["openAPIV3Schema"])
    schema["properties"].pop("status", None)  # written by the operator, not by us
    return strict(schema)


def pod_specs(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    replicas = job["spec"].get("mpiReplicaSpecs") or job["spec"]["pytorchReplicaSpecs"]
    return {role: spec["template"]["spec"] for role, spec in replicas.items()}


def training_args(container: dict[str, Any]) -> list[str]:
    args = container["args"]
    assert args[:2] == ["bash", "launch/k8s/pod.sh"], args
    return args


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
@pytest.mark.parametrize("template", TEMPLATES)
def test_rendered_manifest_is_valid_against_the_operator_crd(template: str, values: dict[str, str]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    job = rendered(template, values)
    schema = crd_schema(TEMPLATES[template], job["apiVersion"], job["kind"])
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]
    assert errors == []
    assert job["metadata"]["name"] == values["NAME"]
    for spec in pod_specs(job).values():  # core pod fields the CRD embeds, checked once more by hand
        assert spec["containers"] and all(c["image"] == values["IMAGE"] for c in spec["containers"])
        names = {v["name"] for v in spec["volumes"]}
        assert all(m["name"] in names for c in spec["containers"] for m in c.get("volumeMounts", []))


def test_strict_schema_catches_a_misspelt_field() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    job = rendered("mpijob-mpirun.yaml", VALUE_SETS["gpu-2x8"])
    spec = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    spec["terminationGracePeriodSecond"] = spec.pop("terminationGracePeriodSeconds")
    schema = crd_schema("kubeflow.org_mpijobs.yaml", job["apiVersion"], job["kind"])
    assert not jsonschema.Draft7Validator(schema).is_valid(job)


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
@pytest.mark.parametrize("template", TEMPLATES)
def test_pods_run_our_entry_points_and_survive_a_stop(template: str, values: dict[str, str]) -> None:
    job = rendered(template, values)
    gpus = int(values.get("GPUS_PER_WORKER", "1"))
    procs = int(values.get("PROCS_PER_WORKER", str(gpus or 1)))
    workers = int(values.get("WORKERS", "2"))
    output_dir = f"/runs/{values['NAME']}"
    specs = pod_specs(job)
    for role, spec in specs.items():
        assert spec["terminationGracePeriodSeconds"] == int(values.get("GRACE_SECONDS", "300")) >= 30
        (container,) = spec["containers"]
        args = training_args(container)
        assert (REPO / args[1]).is_file()
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        claims = {
            v["name"]: v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        }
        limits = container["resources"].get("limits", {})
        if role == "Launcher":
            assert "nvidia.com/gpu" not in limits
        else:  # a pod with ranks: the output directory is on the PVC, and GPUs as asked
            assert claims[mounts["/runs"]] == values["PVC"] and output_dir.startswith("/runs/")
            assert limits.get("nvidia.com/gpu") == (gpus or None)
            assert mounts["/dev/shm"] in {v["name"] for v in spec["volumes"] if "emptyDir" in v}
        if role == "Worker" and job["kind"] == "MPIJob":
            assert args[2:] == ["worker"]
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["HVT_SSH_SECRET_DIR"] == job["spec"]["sshAuthMountPath"]
            assert container["readinessProbe"]["tcpSocket"]["port"] == int(env["SSH_PORT"])
            continue
        launched = args[args.index("--") + 1 :]
        assert launched[launched.index("train") - 1] in ("--", "horovod_train")
        assert flag(launched, "--output_dir") == output_dir
        assert flag(launched, "--resume_from_checkpoint") == "auto"
        if job["kind"] == "MPIJob":
            assert launched[0] in ("launch/mpirun.sh", "launch/horovodrun_multihost.sh")
            assert (REPO / launched[0]).is_file()
            assert flag(launched, "--hostfile") == "/etc/mpi/hostfile"  # the operator's hostfile
            worker_env = specs["Worker"]["containers"][0]["env"]
            assert flag(launched, "--ssh-port") == next(e["value"] for e in worker_env if e["name"] == "SSH_PORT")
            assert (launched[0] == "launch/mpirun.sh") == (args[3:5] == ["--forward", "USR1"])
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["HVT_SSH_SECRET_DIR"] == job["spec"]["sshAuthMountPath"]
        else:
            assert container["name"] == "pytorch"  # the Training Operator finds the container by this name
            assert launched[:2] == ["torchrun", "--nnodes"] and flag(launched, "--nnodes") == str(workers)
            assert flag(launched, "--nproc_per_node") == str(procs) == job["spec"]["nprocPerNode"]
            assert flag(launched, "-m") == "horovod_train" and flag(launched, "--engine") == "ddp"
            assert {p["name"] for p in container["ports"]} == {"pytorchjob-port"}
    if job["kind"] == "MPIJob":
        assert job["spec"]["slotsPerWorker"] == procs
        assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == workers
    else:
        replicas = job["spec"]["pytorchReplicaSpecs"]
        assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, workers - 1)


def test_train_args_pass_through_as_strings() -> None:
    job = rendered("mpijob-horovodrun.yaml", {**BASE, "TRAIN_ARGS": "--max_steps 10 --learning_rate=3e-5 --no_bf16"})
    args = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["args"]
    start = args.index("train") + 1
    assert args[start : start + 4] == ["--max_steps", "10", "--learning_rate=3e-5", "--no_bf16"]


def test_the_pytorchjob_runs_exactly_the_engines_torchrun_starts() -> None:
    """ENGINE: every engine row whose ranks torchrun starts renders (a sharded engine for a model whose replica does
    not fit a GPU), and no other: render.py reads the rows of its checkout."""
    from horovod_train.engines.specs import ENGINES

    for name, spec in ENGINES.items():
        proc = render("pytorchjob-ddp.yaml", {**BASE, "ENGINE": name})
        if spec.launcher != "torchrun":
            assert proc.returncode == 2 and f"ENGINE={name!r} is not a valid value" in proc.stderr, name
            continue
        assert proc.returncode == 0, proc.stderr
        for spec in pod_specs(yaml.safe_load(proc.stdout)).values():
            launched = training_args(spec["containers"][0])
            assert flag(launched, "--engine") == name


BAD_VALUES = [
    ({"IMAGE": "x", "PVC": "p"}, "needs NAME"),
    ({**BASE, "NAMESPACE": "ml"}, "has no value NAMESPACE"),
    ({**BASE, "NAME": "Bert_1"}, "NAME='Bert_1' is not a valid value"),
    ({**BASE, "IMAGE": "img:1 --privileged"}, "IMAGE="),
    ({**BASE, "WORKERS": "0"}, "WORKERS=0 is out of range"),
    ({**BASE, "WORKERS": "two"}, "WORKERS='two' is not a valid value"),
    # digits of other scripts: int() reads them, Kubernetes would not
    ({**BASE, "WORKERS": "\uff12"}, "WORKERS='\uff12' is not a valid value"),
    ({**BASE, "MEMORY_PER_WORKER": "\u0661\u0666Gi"}, "MEMORY_PER_WORKER='\u0661\u0666Gi' is not a valid value"),
    ({**BASE, "GRACE_SECONDS": "5"}, "GRACE_SECONDS=5 is out of range"),
    ({**BASE, "GPUS_PER_WORKER": "4", "PROCS_PER_WORKER": "2"}, "leave PROCS_PER_WORKER out"),
    ({**BASE, "TRAIN_ARGS": "--output_dir /elsewhere"}, "TRAIN_ARGS sets --output_dir"),
    ({**BASE, "TRAIN_ARGS": "--resume_from_checkpoint=latest"}, "TRAIN_ARGS sets --resume_from_checkpoint"),
    ({**BASE, "TRAIN_ARGS": "--run_name 'a: b'"}, "characters a manifest would need quoted"),
    ({**BASE, "TRAIN_ARGS": "--run_name 'open"}, "cannot be split into words"),
]


@pytest.mark.parametrize(("values", "expected"), BAD_VALUES, ids=[e for _, e in BAD_VALUES])
def test_bad_values_are_one_line_and_nothing_rendered(values: dict[str, str], expected: str) -> None:
    for template in TEMPLATES:
        proc = render(template, values)
        assert proc.returncode == 2 and proc.stdout == ""
        (line,) = proc.stderr.splitlines()
        assert line.startswith("error: ") and "; fix: " in line and expected in line, line


def test_pod_script_is_shellcheck_clean_and_refuses_bad_use(tmp_path: Path) -> None:
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    proc = subprocess.run(["shellcheck", "-x", "launch/k8s/pod.sh"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout
    env = {k: v for k, v in os.environ.items() if k != "HVT_SSH_SECRET_DIR"}
    for args, expected in [
        (["nonsense"], "unknown mode 'nonsense'"),
        (["run"], "pod.sh run needs a command"),
        (["run", "--forward", "KILL", "--", "true"], "--forward 'KILL' is not"),
        (["worker"], "HVT_SSH_SECRET_DIR is not set"),  # before any sshd is started
    ]:
        proc = subprocess.run(
            ["bash", "launch/k8s/pod.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=30
        )
        (line,) = proc.stderr.splitlines()
        assert proc.returncode == 2 and line.startswith("error: ") and expected in line, line


# SIGTERM comes once 20 steps are logged, the stop a few steps later: 100 to spare, and the restarted pod trains the
# rest (as test_stopping.py's jobs).
MAX_STEPS = 120
JOB = [*SMALL_JOB, "--synthetic_num_examples", "3000", "--max_steps", str(MAX_STEPS), "--logging_steps", "5"]


def logged_step(out: Path) -> int:
    metrics = out / "metrics.jsonl"
    lines = metrics.read_text().splitlines() if metrics.exists() else []
    return json.loads(lines[-1])["step"] if lines else 0


def pod(command: list[str], out: Path, cache_dir: Path) -> subprocess.Popen[str]:
    full = [
        "bash",
        "launch/k8s/pod.sh",
        "run",
        "--",
        *command,
        "--output_dir",
        str(out),
        "--resume_from_checkpoint",
        "auto",
    ]
    # What the operator gives torchrun (PET_MASTER_PORT): a free port, not torchrun's 29500 that another job on this
    # machine may hold.
    env = {**base_env(cache_dir), "PET_MASTER_PORT": str(free_port())}
    return subprocess.Popen(
        full,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


DECOY = """
import signal, sys, time
from pathlib import Path
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda *_: Path(sys.argv[1]).touch())
time.sleep(600)
"""

CONSOLE_SCRIPT = str(BIN / "horovod-train")  # the kernel runs it as `python .../horovod-train`
# Both spellings of the command, both kinds of rank process (a single process, torchrun's workers): which
# processes are ranks does not depend on the spelling (launch/ranks.sh), so each launch takes one of them.
LAUNCHES = {
    # The console script (no `horovod_train` in the command line), with a DataLoader worker: a forked child of the
    # rank that must not be taken for it (the rank, its parent, would then be left out as a launcher).
    "console-script": ([CONSOLE_SCRIPT, "train", "--engine", "single", *JOB, "--dataloader_num_workers", "1"], 75),
    # torchrun reports its workers' exit 75 as a failure of its own: the pod restarts (restartPolicy OnFailure)
    "torchrun": (
        [
            str(Path(sys.executable).parent / "torchrun"),
            "--nproc_per_node",
            "2",
            "-m",
            "horovod_train",
            "train",
            "--engine",
            "ddp",
            *JOB,
        ],
        1,
    ),
}
# The restart runs the same pod.sh command again; what it adds to a resume (pod.sh starting the command anew, a
# launcher's ranks each finding the checkpoint) is the torchrun pod's. The single process's stop checkpoint is
# resumed in this process: no second start-up for a resume that runs no differently there.
RESTARTED_AS_A_POD = {"torchrun"}


@pytest.mark.slow
@pytest.mark.parametrize("launch", LAUNCHES)
def test_pod_sigterm_checkpoints_and_the_restarted_pod_resumes(launch: str, tmp_path: Path, cache_dir: Path) -> None:
    command, stopped_exit = LAUNCHES[launch]
    out, decoy_got = tmp_path / "out", tmp_path / "decoy-got-a-signal"
    # Another job's rank on the same machine (not this pod's): outside a pod's PID namespace it must be left alone.
    decoy = subprocess.Popen([sys.executable, "-c", DECOY, str(decoy_got), "horovod_train"])
    job = pod(command, out, cache_dir)
    try:
        deadline = time.monotonic() + 240
        while logged_step(out) < 20:
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()[0][-3000:]
            time.sleep(0.5)
        job.send_signal(signal.SIGTERM)  # what the kubelet does: SIGTERM to the container's main process only
        output, _ = job.communicate(timeout=120)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
        decoy_alive = decoy.poll() is None
        decoy.kill()
        decoy.wait()
    assert job.returncode == stopped_exit, output[-3000:]
    assert "[pod] SIGTERM: checkpoint signal to ranks:" in output
    assert decoy_alive and not decoy_got.exists(), "pod.sh signalled a process outside its pod"
    saved = RunDirectory(out).checkpoints()
    assert saved, output[-3000:]
    step = ckpt.verify_checkpoint(saved[-1])["global_step"]
    assert 20 <= step < MAX_STEPS and f"stopped by SIGUSR1 at step {step}: saved checkpoint-{step}" in output

    if launch in RESTARTED_AS_A_POD:
        restarted = pod(command, out, cache_dir)  # the restarted pod runs the same command
        output, _ = restarted.communicate(timeout=400)
        code = restarted.returncode
    else:  # the same training arguments, resumed in this process
        resumed = train_here(cache_dir, *command[2:], "--output_dir", str(out), "--resume_from_checkpoint", "auto")
        output, code = resumed.stdout + resumed.stderr, resumed.returncode
    assert code == 0, output[-3000:]
    assert f"resumed from step {step}" in output
    results = json.loads((out / "all_results.json").read_text())
    assert results["global_step"] == MAX_STEPS and len(set(results["param_checksum_per_rank"])) == 1
