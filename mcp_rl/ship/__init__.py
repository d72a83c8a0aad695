"""Using the trained agent: export (merged, GGUF, Ollama) and an OpenAI-compatible endpoint."""
