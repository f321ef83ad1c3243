"""docker/ checks that building and running the images (tests/system/test_docker_build.py: CPU; test_gpu_image.py: GPU
from the Debian base, both with Podman) does not prove: hadolint, the default GPU build's arguments (the CUDA base
image and its torch index, which cannot be fetched here),
no keys baked in, sshd refusing passwords, `make setup` running the image's scripts, and the Apptainer
definition (no Apptainer here)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support.docker import DOCKERFILE, SHARED_SCRIPTS, instructions
from support.jobs import REPO

DEFFILE = REPO / "docker" / "horovod-train.def"


def arg_defaults(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.M))


def deffile_sections(path: Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Apptainer definition file: header keys and each %section's lines (as Apptainer's parser reads them)."""
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("%"):
            current = line[1:].split()[0]
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line and not line.startswith("#"):
            key, _, value = line.partition(":")
            header[key.strip().lower()] = value.strip()
    return header, sections


def test_no_key_is_baked_into_the_image() -> None:
    """Keys are mounted at run time (the build cannot tell a baked-in key from any other file)."""
    copies = [args.split() for keyword, args in instructions(DOCKERFILE) if keyword == "COPY"]
    assert copies
    for words in copies:
        assert not any(re.search(r"id_\w+|authorized_keys|\.pem$", w) for w in words), f"a key baked in: {words}"
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines() if line.strip()}
    assert {".git", ".venv", "runs"} <= ignored


def test_gpu_build_is_the_default_and_the_cpu_variant_is_documented() -> None:
    args = arg_defaults(DOCKERFILE)
    base, index = args["BASE_IMAGE"], args["TORCH_INDEX_URL"]
    match = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-cudnn-devel-ubuntu[\d.]+", base)
    assert match, base
    # torch's CUDA = the toolkit's. What the build makes of a CUDA torch (NCCL, Gloo, MPI) and what its check
    # wants: tests/unit/test_build_horovod.py.
    assert index.endswith(f"/whl/cu{match[1]}{match[2]}"), (base, index)
    text = DOCKERFILE.read_text()
    assert "--build-arg BASE_IMAGE=debian:bookworm-slim" in text
    assert "--build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in text


def test_apptainer_definition_uses_the_same_scripts_and_defaults() -> None:
    header, sections = deffile_sections(DEFFILE)
    assert header == {"bootstrap": "docker", "from": "{{ BASE_IMAGE }}"}
    valid = {"arguments", "files", "environment", "post", "test", "runscript", "help", "labels"}
    assert set(sections) <= valid, set(sections) - valid
    arguments = dict(line.split("=", 1) for line in sections["arguments"] if line)
    docker_args = arg_defaults(DOCKERFILE)
    assert arguments["BASE_IMAGE"] == docker_args["BASE_IMAGE"]
    assert arguments["TORCH_INDEX_URL"] == docker_args["TORCH_INDEX_URL"]
    for line in filter(None, sections["files"]):
        source, destination = line.split()
        assert (REPO / source).exists(), f"%files {source}: no such path"
        assert destination.startswith("/opt/horovod-train/")
    post = "\n".join(sections["post"])
    order = [post.find(f"bash {SHARED_SCRIPTS[0]}"), post.find("-r requirements.txt")]
    order += [post.find(f"bash {SHARED_SCRIPTS[1]}"), post.find('horovodrun" --check-build')]
    order += [post.find("bash scripts/check_horovod_build.sh")]
    assert -1 not in order and order == sorted(order), order
    # As in the Dockerfile: torch from its index alone, its CUDA checked, no NCCL from apt.
    assert '--no-deps --index-url "{{ TORCH_INDEX_URL }}"' in post and "--extra-index-url" not in post
    assert "bash scripts/check_cuda_match.sh --strict" in post and "libnccl" not in post
    assert any("horovodrun --check-build" in line for line in sections["test"])


@pytest.mark.parametrize("path", ["launch/slurm/horovod_apptainer.sbatch"])
def test_apptainer_job_runs_the_image_python(path: str) -> None:
    """The SLURM script runs what the image installs: `python` from /opt/venv, the demo config in the image."""
    text = (REPO / path).read_text()
    assert '"$runtime" exec "${nv[@]}" "$image"' in text and "python -m horovod_train" in text
    _, sections = deffile_sections(DEFFILE)
    assert "export PATH=/opt/venv/bin:$PATH" in sections["environment"]
    assert "HVT_DEFAULT_CONFIG=/opt/horovod-train/configs/demo.yaml" in text
    assert "configs /opt/horovod-train/configs" in sections["files"]


def run_instructions() -> str:
    return "\n".join(args for keyword, args in instructions(DOCKERFILE) if keyword == "RUN")


def test_gpu_image_takes_nccl_from_torchs_pip_wheel_not_apt() -> None:
    """The CUDA repository's newest libnccl-dev is a CUDA 13 build: apt refuses it next to the 12.8 base's
    libnccl2, and Horovod would link a CUDA 13 NCCL. build_horovod.sh links the NCCL wheel torch loads
    (tests/unit/test_build_horovod.py::test_horovod_links_torchs_pip_nccl_before_the_systems)."""
    assert "libnccl" not in run_instructions()


def test_gpu_image_copies_what_the_horovod_build_imports() -> None:
    """build_horovod.sh runs `python -m horovod_train.build_horovod` before the package is copied: the files it
    imports come first (a directory copied counts as its modules)."""
    import ast

    def imports(module: str) -> set[str]:
        tree = ast.parse((REPO / f"{module.replace('.', '/')}.py").read_text())
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("horovod_train"):
                found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
        return {m for m in found if (REPO / f"{m.replace('.', '/')}.py").is_file()}

    needed, todo = set(), ["horovod_train.build_horovod.__main__"]
    while todo:
        module = todo.pop()
        if module not in needed:
            needed.add(module)
            todo += imports(module)
    files = {f"{m.replace('.', '/')}.py" for m in needed}
    files |= {f"{'/'.join(m.split('.')[:i])}/__init__.py" for m in needed for i in range(1, m.count(".") + 1)}
    steps = instructions(DOCKERFILE)
    built_at = next(i for i, (k, a) in enumerate(steps) if k == "RUN" and "bash scripts/build_horovod.sh" in a)
    early = {w for keyword, args in steps[:built_at] if keyword == "COPY" for w in args.split()[:-1]}
    copied = {w for w in early if w.startswith("horovod_train/") and not (REPO / w).is_dir()}
    copied |= {str(p.relative_to(REPO)) for w in early if (REPO / w).is_dir() for p in (REPO / w).glob("*.py")}
    assert files <= copied, sorted(files - copied)


def test_gpu_image_installs_torch_from_its_index_alone_and_checks_its_cuda() -> None:
    runs = run_instructions()
    assert "--extra-index-url" not in runs  # PyPI's torch (a CUDA 13 build) could win
    assert '--no-deps --index-url "$TORCH_INDEX_URL"' in runs
    assert "scripts/check_cuda_match.sh --strict" in runs
    assert "scripts/check_cuda_match.sh" in " ".join(a for k, a in instructions(DOCKERFILE) if k == "COPY")
    # torch's CUDA against nvcc's: test_build_horovod.py::test_an_nvcc_of_another_cuda_than_torchs_is_one_line
