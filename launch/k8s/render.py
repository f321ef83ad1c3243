#!/usr/bin/env python3
"""Render a launch/k8s/*.yaml template with the values you change, for `kubectl apply -f -`.

    python3 launch/k8s/render.py launch/k8s/mpijob-mpirun.yaml NAME=bert IMAGE=registry/horovod-train:gpu \\
        PVC=shared-runs WORKERS=2 GPUS_PER_WORKER=8 TRAIN_ARGS='--config configs/demo.yaml' | kubectl apply -f -

Python's standard library and the checkout it sits in (no horovod-train install needed where you render: the
engine rows it reads, horovod_train/engines/specs.py, import no torch). A template names its values as
${VAR}; every value is checked against its domain before anything is printed, so what lands in the YAML is
a plain word or number (no quoting to get wrong). A value the template does not use, or a required value left
out, is one line `error: ...; fix: ...` and exit status 2. Run with a template and no values to see its values.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's horovod_train, before any installed one
from horovod_train.engines.specs import started_by  # noqa: E402

TORCHRUN_ENGINES = started_by("torchrun")  # the engines whose ranks torchrun starts (the PyTorchJob's)
MOUNT_PATH = "/runs"  # where the PVC is mounted; the run writes to /runs/<NAME>
ARGS_SET_BY_TEMPLATES = ("--output_dir", "--resume_from_checkpoint", "--engine")


class RenderError(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(f"error: {problem}; fix: {fix}")


@dataclass(frozen=True)
class Value:
    help: str
    pattern: str  # the whole value must match
    default: str | None = None  # None: required
    low: int | None = None  # whole numbers: the range
    high: int | None = None


VALUES = {
    "NAME": Value("job name (DNS label, <= 40 characters: pods add suffixes)", r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?"),
    "IMAGE": Value("image built from docker/Dockerfile", r"[A-Za-z0-9][A-Za-z0-9._/:@-]*"),
    "PVC": Value("a ReadWriteMany PersistentVolumeClaim for the output", r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?"),
    "WORKERS": Value("worker pods (nodes)", r"\d+", "2", 1, 10000),
    "GPUS_PER_WORKER": Value("GPUs per worker pod, one rank each (0: CPU)", r"\d+", "1", 0, 64),
    "PROCS_PER_WORKER": Value("ranks per worker pod (default: GPUS_PER_WORKER, or 1 on CPU)", r"\d+", "", 1, 1024),
    "CPUS_PER_WORKER": Value("CPU cores requested per worker pod", r"\d+", "4", 1, 1024),
    "MEMORY_PER_WORKER": Value("memory requested per worker pod", r"\d+(Ki|Mi|Gi|Ti)", "16Gi"),
    "GRACE_SECONDS": Value(
        "terminationGracePeriodSeconds: the time a stopped pod has to write its checkpoint", r"\d+", "300", 30, 86400
    ),
    "BACKOFF_LIMIT": Value("restarts of the job before it is failed (each resumes)", r"\d+", "6", 0, 1000),
    "SSH_PORT": Value("sshd port of the workers (the image's SSH_PORT)", r"\d+", "12345", 1, 65535),
    "ENGINE": Value(f"the engine torchrun starts: {', '.join(TORCHRUN_ENGINES)}", "|".join(TORCHRUN_ENGINES),
                    TORCHRUN_ENGINES[0]),  # by default the rows' first, the most preferred
    "RDZV_PORT": Value("torchrun's rendezvous port on the master pod", r"\d+", "29500", 1, 65535),
    "TRAIN_ARGS": Value("training arguments, shell words (not --output_dir/--resume_from_checkpoint/--engine)",
                        r"[^\n]*", "--config configs/demo.yaml"),
}
DERIVED = {"OUTPUT_DIR", "OTHER_WORKERS"}  # computed from the values above
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
LIST_LINE = re.compile(r"^(\s*)- \$\{([A-Z_]+)\.\.\.\}\s*$")  # "- ${TRAIN_ARGS...}": one list item per word
ONLY_IF = re.compile(r"\s*# only if ([A-Z_]+)$")  # a line kept only when that value is not 0


def template_values(text: str) -> set[str]:
    names = set(PLACEHOLDER.findall(text)) | {m[2] for m in map(LIST_LINE.match, text.splitlines()) if m}
    names |= {m[1] for m in map(ONLY_IF.search, text.splitlines()) if m}
    return names - DERIVED


def parse_assignments(words: list[str], allowed: set[str], template: str) -> dict[str, str]:
    given: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise RenderError(f"{word!r} is not KEY=VALUE", "pass values as NAME=bert IMAGE=... PVC=...")
        if key not in allowed:
            raise RenderError(f"{template} has no value {key}", f"use {', '.join(sorted(allowed))}")
        if key in given:
            raise RenderError(f"{key} given twice", f"pass {key}=... once")
        given[key] = value
    return given


def check_value(key: str, value: str) -> str:
    spec = VALUES[key]
    # ASCII: \d alone matches other scripts' digits too (fullwidth, Arabic-Indic), which int() reads
    if not re.fullmatch(spec.pattern, value, re.ASCII):
        raise RenderError(f"{key}={value!r} is not a valid value ({spec.help})", f"pass {key} matching {spec.pattern}")
    if spec.low is not None and spec.high is not None and not spec.low <= int(value) <= spec.high:
        raise RenderError(f"{key}={value} is out of range", f"pass {key} in {spec.low}..{spec.high}")
    return str(int(value)) if spec.low is not None else value


def train_args(value: str) -> list[str]:
    try:
        words = shlex.split(value)
    except ValueError as exc:
        raise RenderError(f"TRAIN_ARGS cannot be split into words ({exc})", "close the quotes in TRAIN_ARGS") from exc
    for word in words:
        if word.split("=")[0] in ARGS_SET_BY_TEMPLATES:
            raise RenderError(f"TRAIN_ARGS sets {word.split('=')[0]}, which the template sets",
                              f"drop it: the output goes to {MOUNT_PATH}/<NAME> and restarts resume with auto")
        if not re.fullmatch(r"[A-Za-z0-9_./:=,+@%-]+", word):
            raise RenderError(f"TRAIN_ARGS word {word!r} has characters a manifest would need quoted",
                              "use plain words (letters, digits, _ . / : = , + @ % -)")
    return words


def resolve(needed: set[str], given: dict[str, str], template: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for key in sorted(needed):
        spec = VALUES[key]
        if key not in given and spec.default is None:
            raise RenderError(f"{template} needs {key} ({spec.help})", f"pass {key}=...")
        raw = given.get(key, spec.default or "")
        values[key] = check_value(key, raw) if raw or key != "PROCS_PER_WORKER" else ""
    gpus = int(values.get("GPUS_PER_WORKER", "0"))
    if "PROCS_PER_WORKER" in values:
        if not values["PROCS_PER_WORKER"]:
            values["PROCS_PER_WORKER"] = str(gpus or 1)
        elif gpus and int(values["PROCS_PER_WORKER"]) != gpus:
            raise RenderError(f"PROCS_PER_WORKER={values['PROCS_PER_WORKER']} with GPUS_PER_WORKER={gpus}",
                              "leave PROCS_PER_WORKER out: one rank per GPU")
    values["OUTPUT_DIR"] = f"{MOUNT_PATH}/{values['NAME']}"
    values["OTHER_WORKERS"] = str(int(values.get("WORKERS", "1")) - 1)  # a PyTorchJob's Worker pods: not the Master
    return values


def render(text: str, values: dict[str, str]) -> str:
    lines: list[str] = []
    for line in text.splitlines():
        only_if = ONLY_IF.search(line)
        if only_if:
            if values[only_if[1]] == "0":
                continue
            line = line[: only_if.start()]
        listed = LIST_LINE.match(line)
        if listed:
            lines += [f"{listed[1]}- {json.dumps(word)}" for word in train_args(values[listed[2]])]
            continue
        lines.append(PLACEHOLDER.sub(lambda m: values[m[1]], line))
    return "\n".join(lines) + "\n"


def render_file(path: Path, words: list[str]) -> str:
    if not path.is_file():
        raise RenderError(f"template {path} does not exist", "pass one of launch/k8s/*.yaml")
    text = path.read_text()
    needed = template_values(text)
    unknown = needed - set(VALUES)
    if unknown:
        raise RenderError(f"{path} uses unknown values {sorted(unknown)}", "add them to VALUES in render.py")
    values = resolve(needed, parse_assignments(words, needed, path.name), path.name)
    if "TRAIN_ARGS" in values:
        train_args(values["TRAIN_ARGS"])  # checked even where no list line uses it
    return render(text, values)


def usage(path: Path) -> str:
    lines = []
    for key in sorted(template_values(path.read_text())):
        default = VALUES[key].default
        shown = "(required)" if default is None else repr(default) if default else "(derived)"
        lines.append(f"  {key}={shown}  {VALUES[key].help}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    try:
        if not argv or argv[0] in ("-h", "--help"):
            raise RenderError("no template given", "run: python3 launch/k8s/render.py launch/k8s/JOB.yaml KEY=VALUE...")
        path = Path(argv[0])
        if len(argv) == 1 and path.is_file():
            print(f"values of {path.name}:\n{usage(path)}", file=sys.stderr)
            return 2
        sys.stdout.write(render_file(path, argv[1:]))
    except RenderError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
