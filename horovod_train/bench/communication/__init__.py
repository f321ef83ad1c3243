"""Communication micro-benchmarks: `bench allreduce` times Horovod's all-reduce against torch.distributed's in the
same processes (single tensors by size, and a model's gradients as each framework fuses or buckets them), and
`bench allreduce-sweep` launches it once per Horovod controller, fusion threshold and cycle time and merges the
results. They measure the collective alone, with no training step around it."""
