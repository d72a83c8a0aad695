"""Past one process: data parallelism (torch.distributed) and remote rollout workers."""
