"""Analytic models, nothing launched: `bench project` predicts data-parallel samples/s and scaling efficiency from
1 to 1024 GPUs (an alpha-beta model of the all-reduce over each engine's buckets), fit.py says which model one GPU
fits in each memory mode (the engines' memory model plus measured activations), layers.py gives the gradient
tensor sizes of the architectures they are computed for."""
