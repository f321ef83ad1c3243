"""Training: the Trainer (trainer.py) and its parts, each small and replaceable, and what the loop advances
and reads (position.py, schedule.py, stopping.py, rng.py, metrics.py, amp.py, peak_memory.py).

  trainer.py      Trainer: setup() builds the run's parts in order, train() runs the loop and the end

  parts.py        RunPlan (steps, epochs, global batch) and RunParts: what setup() builds
  build.py        the builders: data, model, optimizer, train loader, plan, start position
  rank_zero.py    rank 0 reads or works first, every rank gets its result or its error
  progress.py     rank 0's log lines, above the progress bar
  resume.py       reading a checkpoint to resume from, restoring its state
  loop.py         TrainingLoop: epochs of optimizer steps, their evaluations and checkpoints
  step.py         one optimizer step (micro-batches, backward, clip and step): the loop's, and `bench gpu`'s
  phases.py       the names of the profiler ranges each step marks (what `bench trace` reads)
  run_log.py      what a run reports as it goes: log_history, metrics.jsonl, trackers, log lines
  evaluation.py   the sharded evaluation loop, shared by evaluate and predict
  saving.py       writing checkpoints, tracking and loading the best one
  finish.py       the end of a run: results gathered, and the files rank 0 writes
  position.py     TrainingPosition: what the loop advances, a checkpoint saves and elastic Horovod commits
  schedule.py     the learning rate as a function of the position
  stopping.py     stop signals: the ranks agree at a step boundary
  rng.py          the seed, and each rank's generator states for exact resume
  metrics.py      exact accuracy over ranks, the training meter, the epoch sample audit
  amp.py          bf16/fp16 autocast and the GradScaler
  peak_memory.py  the process's peak memory and the activations' estimate (the memory check's inputs)

None of them knows Horovod or DDP: every collective goes through the engine.
"""
