"""No launcher: a plain ``python`` process, a world of one (the single and dp engines)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from horovod_train.common.errors import UsageError
from horovod_train.launching.base import (
    ENV_RENDEZVOUS,
    HOROVOD_RENDEZVOUS,
    ONE_PROCESS,
    Launcher,
    Master,
    Ranks,
    free_port,
    int_variable,
)


class PlainPython(Launcher):
    name, tool = "plain", "python"
    rendezvous = ONE_PROCESS
    # Its world of one: torch.distributed on a free local port (master), Horovod alone.
    rendezvous_offered = (ONE_PROCESS, ENV_RENDEZVOUS, HOROVOD_RENDEZVOUS)
    fallback = True

    def detects(self, env: Mapping[str, str]) -> bool:
        return True

    def ranks(self, env: Mapping[str, str]) -> Ranks:
        return Ranks(0, 0, 1, 1)

    def master(self, env: Mapping[str, str], rank: int, resolve: bool) -> Master:
        return "127.0.0.1", int_variable(env, "MASTER_PORT", 0) or (free_port() if resolve else None)

    def command(self, program: Sequence[str], processes: int | None = None, **options: object) -> list[str]:
        if processes not in (None, 1):
            raise UsageError(f"plain python starts one process, not {processes}", "use a launcher")
        return list(program)

    def find_tool(self) -> str:
        return sys.executable

    def tool_installed(self) -> bool:
        return True  # this python
