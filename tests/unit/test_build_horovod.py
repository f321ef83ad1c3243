"""`horovod-train build-horovod`, in-process: what is missing is one line naming the package to install, raised
before anything is downloaded or built; the cache key, the source patch and the cached wheel's digest."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from pathlib import Path

import pytest

from horovod_train.build_horovod import build, install, progress, toolchain
from horovod_train.build_horovod.plan import Options, Plan, cache_root, make_plan, with_build_tools
from horovod_train.build_horovod.target import Target, running_target
from horovod_train.cli import main as cli
from horovod_train.common.errors import UsageError


def tool_dir(path: Path, *names: str) -> Path:
    """A directory holding the named tools: links to the real ones, or empty scripts where the name is not here."""
    path.mkdir(parents=True, exist_ok=True)
    for name in names:
        real = next((Path(d) / name for d in os.environ["PATH"].split(os.pathsep) if (Path(d) / name).is_file()), None)
        if real:
            (path / name).symlink_to(real)
        else:
            (path / name).write_text("#!/bin/sh\nexit 1\n")
            (path / name).chmod(0o755)
    return path


def target_in(bin_dir: Path, torch_cuda: str | None = None) -> Target:
    """The environment a build is for: an interpreter in ``bin_dir`` (which holds only what a test puts there)."""
    return Target(str(bin_dir / "python"), bin_dir.parent, "2.13.0+cpu", torch_cuda, "cp311")


@pytest.fixture
def only_tools(tmp_path, monkeypatch):
    """PATH made of the given tools alone; CXX and Horovod's variables unset; an empty wheel cache."""

    def make(*names: str) -> Path:
        path = tool_dir(tmp_path / "path", *names)
        monkeypatch.setenv("PATH", str(path))
        return path

    for name in ("CXX", "HOROVOD_WITHOUT_MPI", "HOROVOD_CUDA_HOME", "HOROVOD_BUILD_CUDA_CC_LIST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOROVOD_WHEEL_CACHE", str(tmp_path / "wheel-cache"))
    return make


def usage_error(capsys, argv: list[str]) -> str:
    """The command's stderr, which must be one `error: ...; fix: ...` line with exit 2."""
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "; fix: " in err[0], err
    return err[0]


def test_no_compiler_names_the_package(only_tools, capsys) -> None:
    only_tools("cmake")
    line = usage_error(capsys, ["build-horovod", "--dry-run"])
    assert "no C++ compiler" in line and "apt-get install g++" in line


def test_a_dry_run_without_the_compiler_prints_the_plan_marking_it(only_tools, capsys) -> None:
    """--dry-run --force with no compiler: the whole plan (the cache key too) with its compiler line saying what is
    missing and how to get it, then the one error line a real run gives (exit 2: the build would fail now)."""
    only_tools("cmake")
    with pytest.raises(SystemExit) as exited:
        cli.main(["build-horovod", "--dry-run", "--force"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    key = make_plan(running_target(), Options(dry_run=True)).key
    missing = "no C++ compiler: c++, g++ or clang++ is not on PATH"
    assert f"compiler:   MISSING: {missing} (fix: apt-get install g++" in out, out
    assert f"cache key:  {key}" in out and "next:       build (--force)" in out, out
    (line,) = err.splitlines()
    assert line.startswith(f"error: {missing}; fix: "), line


def test_cxx_with_flags_is_found_by_its_first_word(only_tools, tmp_path, monkeypatch) -> None:
    """CXX is a command line (CMake reads flags from it too): 'g++ -O2' is g++ on PATH, its flags kept for the build."""
    path = only_tools("g++", "cmake")
    monkeypatch.setattr(toolchain, "check_build_modules", lambda: None)  # setuptools and wheel: not what this checks
    target = target_in(tmp_path / "venv" / "bin")
    monkeypatch.setenv("CXX", "g++ -O2")
    plan = with_build_tools(make_plan(target, Options(dry_run=True)))
    assert plan.compiler == f"{path / 'g++'} -O2"
    assert build.build_env(plan, Options())["CXX"] == plan.compiler
    monkeypatch.setenv("CXX", "g++-404 -O2")
    with pytest.raises(UsageError) as error:
        with_build_tools(make_plan(target, Options(dry_run=True)))
    assert "g++-404 (CXX=g++-404 -O2) is not on PATH" in error.value.problem and "unset CXX" in error.value.fix


def test_no_cmake_names_pip_cmake(only_tools, tmp_path) -> None:
    only_tools("c++")
    with pytest.raises(UsageError) as error:
        with_build_tools(make_plan(target_in(tmp_path / "venv" / "bin"), Options(dry_run=True)))
    assert "no cmake" in error.value.problem and "pip install 'cmake<5'" in error.value.fix


def test_cmake_next_to_the_python_is_enough(only_tools, tmp_path, monkeypatch) -> None:
    """pip's cmake lives in the environment's bin/, which need not be on PATH (a venv not activated)."""
    only_tools("c++")
    # setuptools and wheel are looked for in this process, which need not have them (.venv does; a user's may not)
    monkeypatch.setattr(toolchain, "check_build_modules", lambda: None)
    venv_bin = tool_dir(tmp_path / "venv" / "bin", "cmake")
    plan = with_build_tools(make_plan(target_in(venv_bin), Options(dry_run=True)))
    assert plan.cmake == str(venv_bin / "cmake") and not plan.mpi


def test_a_cached_wheel_installs_without_the_build_tools(only_tools, capsys, monkeypatch) -> None:
    """Another environment with the same torch (a shared cache on a cluster): no compiler, cmake or wheel module
    needed, the plan is to install the cached wheel; a build (--force) asks for them, one line."""
    only_tools()
    monkeypatch.setitem(sys.modules, "wheel", None)
    plan = make_plan(running_target(), Options(dry_run=True))
    plan.wheel_dir.mkdir(parents=True)
    (plan.wheel_dir / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl").write_bytes(b"a wheel built earlier")
    assert cli.main(["build-horovod", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"next:       install the cached wheel {plan.wheel_dir}" in out, out
    assert "compiler:   not needed (no build)" in out and "cmake:      not needed (no build)" in out, out
    assert "no C++ compiler" in usage_error(capsys, ["build-horovod", "--dry-run", "--force"])


def test_mpirun_without_mpi_headers_names_libopenmpi_dev(only_tools, tmp_path) -> None:
    only_tools("c++", "cmake", "mpirun")
    with pytest.raises(UsageError) as error:
        make_plan(target_in(tmp_path / "venv" / "bin"), Options(dry_run=True))
    assert "MPI headers missing" in error.value.problem and "apt-get install libopenmpi-dev" in error.value.fix
    assert not make_plan(target_in(tmp_path / "venv" / "bin"), Options(dry_run=True, mpi=False)).mpi


def test_horovod_without_mpi_variable_and_the_flag_that_overrides_it(only_tools, tmp_path, monkeypatch) -> None:
    only_tools("c++", "cmake", "mpicxx")
    monkeypatch.setenv("HOROVOD_WITHOUT_MPI", "1")
    target = target_in(tmp_path / "venv" / "bin")
    assert not make_plan(target, Options(dry_run=True)).mpi
    assert make_plan(target, Options(dry_run=True, mpi=True)).mpi


def test_with_mpi_asked_for_and_none_there(only_tools, capsys) -> None:
    only_tools("c++", "cmake")
    line = usage_error(capsys, ["build-horovod", "--dry-run", "--with-mpi"])
    assert "libopenmpi-dev" in line


def test_cuda_torch_without_nvcc_names_the_cuda_wheels(only_tools, tmp_path) -> None:
    only_tools("c++", "cmake")
    with pytest.raises(UsageError) as error:
        make_plan(target_in(tmp_path / "venv" / "bin", torch_cuda="13.0"), Options(dry_run=True, mpi=False))
    assert "CUDA 13.0 build" in error.value.problem and "no nvcc" in error.value.problem
    assert "pip install nvidia-cuda-runtime-cu13 nvidia-cuda-nvcc-cu13" in error.value.fix


def test_cuda_toolkit_without_headers(only_tools, tmp_path, monkeypatch) -> None:
    only_tools("c++", "cmake")
    toolkit = tool_dir(tmp_path / "cuda" / "bin", "nvcc").parent
    monkeypatch.setenv("HOROVOD_CUDA_HOME", str(toolkit))
    with pytest.raises(UsageError) as error:
        make_plan(target_in(tmp_path / "venv" / "bin", torch_cuda="13.0"), Options(dry_run=True, mpi=False))
    assert "CUDA headers are missing" in error.value.problem and "nvidia-cuda-runtime-cu13" in error.value.fix


def test_no_torch(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` fails as where it is not installed
    line = usage_error(capsys, ["build-horovod", "--dry-run"])
    assert "torch is not importable" in line and "pip install torch" in line


def test_nccl_asked_for_with_a_cpu_torch(capsys) -> None:
    line = usage_error(capsys, ["build-horovod", "--dry-run", "--with-nccl"])
    assert "CPU build" in line and "--with-nccl" in line


def plan_for(torch_cuda: str | None, archs: str | None = None, nccl: bool = True, mpi: bool = True) -> Plan:
    target = Target(
        "/env/bin/python", Path("/env"), "2.13.0+cu130" if torch_cuda else "2.13.0+cpu", torch_cuda, "cp311"
    )
    nccl_env = {"HOROVOD_NCCL_LIB": "/env/nccl-link"} if nccl and torch_cuda else {}
    return Plan(target, "0.28.1", mpi, "c++", "cmake", cuda_archs=archs, nccl_env=nccl_env)


def test_cache_key_per_torch_cuda_python_architectures() -> None:
    """The default keys are the ones scripts/podman_build.sh computes (wheels built before stay cache hits)."""
    assert plan_for(None).key == "horovod-0.28.1-torch2.13.0_cpu-cudacpu-cp311"
    gpu = plan_for("13.0", "75,80,86,89,90,100,120")
    assert gpu.key == "horovod-0.28.1-torch2.13.0_cu130-cuda13.0-cp311-sm75_80_86_89_90_100_120"
    assert plan_for("13.0", "90").key.endswith("-sm90")
    assert plan_for("13.0", "90", nccl=False).key.endswith("-sm90-nonccl")
    assert plan_for(None, mpi=False).key.endswith("-cp311-nompi")


def test_cache_root_follows_the_projects_cache(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("HOROVOD_WHEEL_CACHE", raising=False)
    monkeypatch.setenv("HOROVOD_TRAIN_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache" / "wheels"
    monkeypatch.setenv("HOROVOD_WHEEL_CACHE", str(tmp_path / "wheels"))
    assert cache_root() == tmp_path / "wheels"


# Horovod 0.28.1's setup.py line that picks the CMake build type.
SETUP_PY = "        config = 'Debug' if self.debug or os.environ.get('HOROVOD_DEBUG') == \"1\" else 'RelWithDebInfo'\n"


def horovod_sources(root: Path) -> Path:
    for name in build.PATCHED_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("project(x)\nset(CMAKE_CXX_STANDARD 14)\n")
    (root / "setup.py").write_text(SETUP_PY)
    return root


def test_sources_are_patched_to_cxx17_and_a_release_build(tmp_path) -> None:
    build.patch_sources(horovod_sources(tmp_path))
    build.patch_sources(tmp_path)  # sources patched before (a HOROVOD_SDIST made from them): the same
    for name in build.PATCHED_FILES:
        assert (tmp_path / name).read_text() == "project(x)\nset(CMAKE_CXX_STANDARD 17)\n"
    assert (tmp_path / "setup.py").read_text() == SETUP_PY.replace("'RelWithDebInfo'", "'Release'")
    (tmp_path / "setup.py").write_text("config = 'MinSizeRel'\n")
    with pytest.raises(RuntimeError, match="no RelWithDebInfo build to patch"):
        build.patch_sources(tmp_path)
    (tmp_path / "CMakeLists.txt").write_text("project(other)\n")
    with pytest.raises(RuntimeError, match="no CMAKE_CXX_STANDARD 14"):
        build.patch_sources(tmp_path)


def test_debug_info_keeps_horovods_build_type_under_a_key_of_its_own(tmp_path) -> None:
    build.patch_sources(horovod_sources(tmp_path), debug_info=True)
    assert (tmp_path / "setup.py").read_text() == SETUP_PY
    plan = plan_for(None)
    plan.debug_info = True
    assert plan.key == "horovod-0.28.1-torch2.13.0_cpu-cudacpu-cp311-debuginfo"
    assert "build type: RelWithDebInfo (--debug-info)" in plan.describe()


def test_build_env_has_the_patches_and_the_nccl_of_the_plan(monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_WITHOUT_MPI", "1")  # left in the shell: the plan (with MPI) decides
    env = build.build_env(plan_for("13.0", "90"), Options(jobs=3))
    assert env["CMAKE_POLICY_VERSION_MINIMUM"] == "3.5" and env["MAKEFLAGS"] == "-j3"
    assert env["HOROVOD_GPU_OPERATIONS"] == "NCCL" and env["HOROVOD_NCCL_LIB"] == "/env/nccl-link"
    assert "HOROVOD_WITHOUT_MPI" not in env
    assert (
        env["HOROVOD_WITH_MPI"] == "1" and env["HOROVOD_WITH_GLOO"] == "1" and env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90"
    )
    cpu = build.build_env(plan_for(None, mpi=False), Options())
    assert "HOROVOD_GPU_OPERATIONS" not in cpu and cpu["HOROVOD_WITHOUT_MPI"] == "1" and "HOROVOD_WITH_MPI" not in cpu


def test_a_cached_wheel_that_changed_is_refused(tmp_path) -> None:
    wheel = tmp_path / "built" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"the wheel as built")
    build.store_wheel(wheel, tmp_path / "cache")
    cached = tmp_path / "cache" / wheel.name
    install.verify_digest(cached)  # as recorded
    cached.write_bytes(b"something else")
    with pytest.raises(UsageError, match="does not match the SHA256SUMS"):
        install.verify_digest(cached)


def test_a_build_of_the_same_key_running_elsewhere_is_waited_for_and_its_wheel_installed(tmp_path, monkeypatch, capsys):
    """Two checkouts' `make setup` at once on a new machine: the second waits while the first builds, then installs
    the first's wheel; it used to build too, both writing the same cache files."""
    monkeypatch.setenv("HOROVOD_WHEEL_CACHE", str(tmp_path / "wheel-cache"))
    monkeypatch.setattr(install, "already_installed", lambda plan: False)
    built, installed = [], []
    monkeypatch.setattr(build, "build_wheel", lambda plan, options: built.append(plan.key))  # never reached
    monkeypatch.setattr(install, "install_wheel", lambda plan, wheel: installed.append(wheel))
    monkeypatch.setattr(install, "check_build", lambda plan: None)
    plan = make_plan(running_target(), Options())
    with build.cache_lock(plan):  # the other checkout's build, in progress
        second = threading.Thread(target=cli.main, args=(["build-horovod"],))
        second.start()
        said, deadline = "", time.monotonic() + 60  # until it waits for this build, or (unlocked) ended, having
        while "waiting for another build-horovod" not in said and second.is_alive():  # found nothing cached
            assert time.monotonic() < deadline, said
            said += capsys.readouterr().out
            time.sleep(0.05)
        wheel = tmp_path / "built" / "horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
        wheel.parent.mkdir()
        wheel.write_bytes(b"the wheel the other build made")
        build.store_wheel(wheel, plan.wheel_dir)
    second.join(timeout=60)
    assert not second.is_alive() and built == [], built
    assert installed == [plan.wheel_dir / wheel.name], installed


def package_imports(module: str) -> tuple[set[str], set[str]]:
    """(horovod_train modules, other top-level imports) of ``module``; `from pkg import mod` counts pkg.mod."""
    import ast

    repo = Path(__file__).resolve().parents[2]
    tree = ast.parse((repo / f"{module.replace('.', '/')}.py").read_text())
    ours, others = set(), set()
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name.startswith("horovod_train."):
                ours |= {name} if (repo / f"{name.replace('.', '/')}.py").is_file() else set()
            else:
                others.add(name.split(".")[0])
    return ours, others


def test_the_command_imports_only_the_standard_library_before_torch() -> None:
    """scripts/build_horovod.sh runs it in an environment holding torch alone (the NCCL build's, an image layer)."""
    seen, todo, third_party = set(), ["horovod_train.build_horovod.__main__"], {}
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            ours, others = package_imports(module)
            todo += ours
            third_party[module] = others - set(sys.stdlib_module_names) - {"torch"}
    assert "horovod_train.build_horovod.build" in seen and "horovod_train.build_horovod.nccl" in seen
    assert {module: found for module, found in third_party.items() if found} == {}


def test_a_long_step_says_it_is_alive_and_how_long_it_took(capsys) -> None:
    """A quiet pip compile of several minutes: a line when it starts, one now and then, one with its time."""
    with progress.stage("compiling", heartbeat_s=0.05):
        time.sleep(0.3)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[horovod] compiling ..." and re.fullmatch(r"\[horovod\] compiling: done in 0\.\d s", lines[-1])
    beats = lines[1:-1]
    assert len(beats) >= 2 and all(re.fullmatch(r"\[horovod\] compiling: 0\.\d s so far", b) for b in beats), lines
    with pytest.raises(RuntimeError), progress.stage("failing", heartbeat_s=60):
        raise RuntimeError("the build broke")
    assert capsys.readouterr().out == "[horovod] failing ...\n"  # no "done" for a step that failed


def test_durations_read_as_setup_writes_them() -> None:
    assert [progress.duration(s) for s in (0.04, 12.34, 59.96, 245.2)] == ["0.0 s", "12.3 s", "59.9 s", "4 min 05 s"]


# ---- what the GPU image relies on (docker/Dockerfile builds with scripts/build_horovod.sh, then checks the build) ----
def test_a_cuda_build_is_chosen_by_torchs_cuda_not_by_nvcc(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    assert running_target().torch_cuda == "13.0"
    monkeypatch.setattr(torch.version, "cuda", None)
    assert running_target().torch_cuda is None


def executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return path


def test_an_nvcc_of_another_cuda_than_torchs_is_one_line(tmp_path, monkeypatch) -> None:
    toolkit = tmp_path / "cuda-12.8"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    nvcc = executable(toolkit / "bin" / "nvcc", 'echo "Cuda compilation tools, release 12.8, V12.8.93"')
    monkeypatch.setenv("HOROVOD_CUDA_HOME", str(toolkit))
    with pytest.raises(UsageError) as error:
        toolchain.find_cuda("13.0", "")
    assert error.value.problem == f"torch is built for CUDA 13.0 but {nvcc} is CUDA 12.8"
    assert error.value.fix.startswith("put a CUDA 13 nvcc first on PATH")


class InstalledFile:
    """A file of an installed distribution, as importlib.metadata lists it."""

    def __init__(self, root: Path, relative: str) -> None:
        self.root, self.relative = root, relative

    def __str__(self) -> str:
        return self.relative

    def locate(self) -> Path:
        return self.root / self.relative


def test_horovod_links_torchs_pip_nccl_before_the_systems(tmp_path, monkeypatch) -> None:
    """The CUDA image has no libnccl from apt: the NCCL Horovod links is the nvidia-nccl wheel torch loads, found
    first and linked as libnccl.so (the wheel ships libnccl.so.2 alone)."""
    import importlib.metadata

    from horovod_train.build_horovod import gpu

    site = tmp_path / "site-packages"
    wheel = [InstalledFile(site, "nvidia/nccl/include/nccl.h"), InstalledFile(site, "nvidia/nccl/lib/libnccl.so.2")]
    for file in wheel:
        file.locate().parent.mkdir(parents=True, exist_ok=True)
        file.locate().write_text("")
    system = tmp_path / "usr"  # an NCCL of the system's too (libnccl-dev)
    system.mkdir()
    (system / "nccl.h").write_text("")
    (system / "libnccl.so").write_text("")
    monkeypatch.setattr(gpu, "SYSTEM_NCCL_DIRS", (str(system),))
    monkeypatch.setattr(gpu, "SYSTEM_LIB_DIRS", (str(system),))
    for name in ("HOROVOD_NCCL_HOME", "HOROVOD_NCCL_LIB"):
        monkeypatch.delenv(name, raising=False)
    installed = {"nvidia-nccl-cu13": type("Wheel", (), {"files": wheel})()}

    def distribution(name: str):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "distribution", distribution)
    found, where = gpu.find_nccl(tmp_path / "env", tmp_path / "cuda", None, link=True)
    assert found["HOROVOD_NCCL_INCLUDE"] == str(site / "nvidia" / "nccl" / "include") and where.startswith("pip wheel")
    assert Path(found["HOROVOD_NCCL_LIB"], "libnccl.so").resolve() == wheel[1].locate()
    installed.clear()
    assert gpu.find_nccl(tmp_path / "env", tmp_path / "cuda", None, link=True)[0]["HOROVOD_NCCL_LIB"] == str(system)


CHECK_BUILD = Path(__file__).resolve().parents[2] / "scripts" / "check_horovod_build.sh"
CPU_BUILD, GPU_BUILD = ["PyTorch", "MPI", "Gloo"], ["PyTorch", "MPI", "Gloo", "NCCL"]


@pytest.mark.parametrize(
    ("cuda_torch", "listed", "without_mpi", "missing"),
    [
        (True, GPU_BUILD, False, None),
        (True, CPU_BUILD, False, "NCCL"),
        (False, CPU_BUILD, False, None),
        (False, ["PyTorch", "Gloo"], False, "MPI"),
        (False, ["PyTorch", "Gloo"], True, None),
        (False, ["MPI", "Gloo"], False, "PyTorch"),
    ],
)
def test_the_build_check_wants_nccl_exactly_for_a_cuda_torch(tmp_path, cuda_torch, listed, without_mpi, missing):
    """scripts/check_horovod_build.sh (make setup, both images) against a stand-in environment: $PYTHON answers
    whether torch is a CUDA build, its horovodrun's --check-build lists ``listed``."""
    import subprocess

    python = executable(tmp_path / "env" / "bin" / "torch-probe", f"exit {0 if cuda_torch else 1}")
    lines = "".join(f"    [X] {item}\\n" for item in listed)
    executable(tmp_path / "env" / "bin" / "horovodrun", f'printf "Available Frameworks:\\n{lines}"')
    env = {k: v for k, v in os.environ.items() if k != "HOROVOD_WITHOUT_MPI"} | {"PYTHON": str(python)}
    env |= {"HOROVOD_WITHOUT_MPI": "1"} if without_mpi else {}
    proc = subprocess.run(["bash", str(CHECK_BUILD)], env=env, capture_output=True, text=True, timeout=60)
    if missing is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 1 and f"does not list {missing};" in proc.stderr, proc


def test_a_dry_run_names_everything_missing_at_once(only_tools, capsys, monkeypatch) -> None:
    """No compiler, no wheel module, mpirun without MPI's headers: the plan marks each, and the one error line names
    all three with their fixes (it named the first, so fixing them took a run each; issue 58)."""
    only_tools("mpirun")
    monkeypatch.setitem(sys.modules, "wheel", None)
    with pytest.raises(SystemExit) as exited:
        cli.main(["build-horovod", "--dry-run"])
    out, err = capsys.readouterr()
    assert exited.value.code == 2
    marked = ["compiler:   MISSING: no C++ compiler", "mpi:        MISSING: MPI headers missing"]
    marked += ["modules:    MISSING: wheel not installed", "next:       build, once what is missing is there"]
    for line in marked:
        assert line in out, (line, out)
    (line,) = err.splitlines()
    problem, fix = line.split("; fix: ")
    assert problem.startswith("error: 3 things missing for the Horovod build: (1) MPI headers missing"), line
    assert "(2) no C++ compiler" in problem and "(3) wheel not installed" in problem, line
    assert fix.startswith("(1) apt-get install libopenmpi-dev") and "(2) apt-get install g++" in fix, line
    assert fix.endswith("(3) pip install wheel"), line
