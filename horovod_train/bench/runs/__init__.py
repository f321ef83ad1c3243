"""Measured training runs: each benchmark here launches the real `horovod-train train` under the engines'
launchers (through compare's runs) and reads what the runs wrote. `bench train` tabulates samples/s per engine and
world size, `bench trace` splits a step into its parts per engine (traced.py: the ranks' recording), `bench memory`
sets full fine-tuning, gradient checkpointing and LoRA side by side (all-reduced bytes, speed, peak memory)."""

# The environment variable that asks the command line to run `train` under traced.recording (bench trace sets it for
# the ranks it launches; mpirun forwards it with the other HOROVOD_ variables). Here, where the command line can read
# it without importing torch.
TRACE_DIR_VARIABLE = "HOROVOD_TRAIN_TRACE_DIR"
