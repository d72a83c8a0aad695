"""Training: the portable GRPO / Dr. GRPO LoRA trainer, its loss and packed update, the SFT warm start, checkpoints and manifests, the ART backend."""
