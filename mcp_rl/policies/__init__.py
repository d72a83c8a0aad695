"""Policies: the interface, OpenAI-compatible and scripted ones, the local transformers policy (batching, KV reuse, CUDA-graph decode), models, chat templates, Unsloth."""
