"""What a run reports as it goes: its log_history (in the position), the trackers, ``metrics.jsonl``
(rank 0; opened per record: after a resize rank 0 may be a new process) and a log line or the bar."""

from __future__ import annotations

import json
import time
from typing import Any

from tqdm import tqdm

from horovod_train.engines.base import Engine
from horovod_train.outputs.run_directory import RunDirectory, RunFiles
from horovod_train.outputs.trackers import Trackers
from horovod_train.tasks.scores import METRIC_NAMES
from horovod_train.training.parts import RunPlan
from horovod_train.training.position import TrainingPosition
from horovod_train.training.progress import Console

METRIC_ENDINGS = tuple(f"_{name}" for name in METRIC_NAMES)


class RunLog:
    def __init__(
        self, engine: Engine, run_dir: RunDirectory, trackers: Trackers, console: Console, plan: RunPlan
    ) -> None:
        self.engine, self.run_dir, self.trackers, self.console, self.plan = engine, run_dir, trackers, console, plan
        self.started = time.perf_counter()  # the training's elapsed time counts from here
        self.pace = (self.started, 0)  # (when, step) the ETA's pace is measured from: see enter()

    def enter(self, position: TrainingPosition) -> None:
        """The loop (re)starts at ``position``: the ETA's pace counts from here, in the world as it is now (a
        resumed run's earlier steps, or the steps of a world before a resize, say nothing of it)."""
        self.pace = (time.perf_counter(), position.global_step)

    def timing(self, position: TrainingPosition) -> str:
        """``elapsed 01:05 eta 02:10`` (tqdm's format), the ETA at the pace since ``enter``."""
        now, (since, first_step) = time.perf_counter(), self.pace
        done = position.global_step - first_step
        left = (now - since) / done * (position.total_steps - position.global_step) if done > 0 else None
        eta = tqdm.format_interval(left) if left is not None else "?"
        return f"elapsed {tqdm.format_interval(now - self.started)} eta {eta}"

    def training(self, position: TrainingPosition, learning_rate: float, meter: dict[str, float]) -> None:
        """A --logging_steps record; ``meter``: the training meter reduced over ranks."""
        record = {
            "step": position.global_step,
            "epoch": self.plan.epoch_float(position),
            "learning_rate": learning_rate,
            "world_size": self.engine.world_size,
            **meter,
        }
        position.log_history.append({k: record[k] for k in ("loss", "grad_norm", "learning_rate", "epoch", "step")
                                     if k in record})  # fmt: skip
        self.trackers.log(record, position.global_step)
        if self.engine.is_main:
            with self.run_dir.file(RunFiles.METRICS).open("a") as f:
                f.write(json.dumps(record) + "\n")
        speed = f"{record['samples_per_second']:.1f}"
        if self.console.show_bar:  # the bar shows the elapsed time and the ETA itself
            self.console.bar.set_postfix(
                {"loss": f"{record['loss']:.4f}", "lr": f"{learning_rate:.3e}", "samples/s": speed}
            )
        else:
            self.console.log(
                f"step {position.global_step}/{position.total_steps} epoch {record['epoch']:.2f} "
                f"loss {record['loss']:.4f} lr {learning_rate:.3e} {speed} samples/s {self.timing(position)}"
            )

    def evaluation(self, position: TrainingPosition, result: dict[str, Any]) -> None:
        position.log_history.append(
            {**{k: v for k, v in result.items() if not k.endswith("_per_rank")},
             "epoch": self.plan.epoch_float(position), "step": position.global_step}
        )  # fmt: skip
        self.trackers.log(position.log_history[-1], position.global_step)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in result.items() if k.endswith(("_loss", *METRIC_ENDINGS)))
        self.console.log(f"eval at step {position.global_step}: {shown} ({result['eval_samples']} examples)")
