"""The in-process GPU benchmark, `bench gpu`: the training step one GPU runs (the trainer's own model finishing,
optimizer and step, training/build.py and training/step.py), timed in this one process per engine and per form of
the step (eager, bucketed, compiled, CUDA graphs), reported as samples/s, tokens/s and model FLOPs utilisation."""
