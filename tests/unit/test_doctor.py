"""doctor names the launcher the user ran and lists only the engines that can run (issue 58)."""

from __future__ import annotations

import sys

from horovod_train.cli import doctor
from horovod_train.cli.main import main
from horovod_train.launching import environment

MPIRUN_RANK = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
# What `horovodrun -np 2 --mpi` gives its ranks besides mpirun's (Open MPI 4: its --tag-output and -mca pml ob1).
HOROVODRUN_MPI = {"OMPI_MCA_orte_tag_output": "1", "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "^openib"}


def test_doctor_names_horovodrun_where_horovodrun_ran_mpirun():
    for variables, named in [
        ({**MPIRUN_RANK, **HOROVODRUN_MPI}, "horovodrun --mpi"),
        (MPIRUN_RANK, "mpirun"),
        ({**MPIRUN_RANK, "OMPI_MCA_pml": "ob1", "OMPI_MCA_btl": "^openib"}, "mpirun"),  # launch/mpirun.sh's flags
        (
            {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "2"},
            "horovodrun",
        ),
    ]:
        assert doctor.launcher_named(environment.detect(variables, resolve_master=False), variables) == named


def test_doctor_lists_only_the_engines_that_can_run(monkeypatch, capsys):
    """Without Horovod importable, horovod is not among the engines (it was)."""
    for module in ("horovod", "horovod.torch"):
        monkeypatch.setitem(sys.modules, module, None)  # `import horovod` raises ImportError
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    (engines,) = [line for line in out.splitlines() if line.startswith("engines: ")]
    assert engines == "engines: ddp, dp, fsdp, single, zero1 (not horovod: horovod.torch is not importable)", engines
    assert "horovod: not importable" in out
