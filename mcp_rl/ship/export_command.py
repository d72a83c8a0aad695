"""The `export` command: a run's LoRA merged onto its base model, and optionally a GGUF file, an Ollama
Modelfile and a private Hub upload.

    python -m mcp_rl export --run runs/demo --merged DIR [--gguf FILE --quant q8_0] [--ollama DIR] [--model BASE] [--dtype auto]

The work lives in mcp_rl/ship/export.py, gguf_export.py and ollama.py; this is their command line
(registered by mcp_rl/cli.py, as serve.py and worker_server.py register theirs).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["cmd_export", "add_export_parser"]


def cmd_export(a: Any) -> int:
    import tempfile

    from mcp_rl.ship.export import find_adapter, merge_adapter, recorded_base_model

    if not (a.merged or a.gguf or a.ollama or a.push_to_hub):
        raise ValueError("nothing to write: pass --merged DIR, --gguf FILE, --ollama DIR and/or --push-to-hub REPO")
    source = a.run or a.adapter
    adapter = find_adapter(source)
    base = a.model or recorded_base_model(source) or "not recorded"
    print(f"LoRA adapter: {adapter} | base model: {base} | merging ({a.dtype})...", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        merged = merge_adapter(source, a.merged or Path(tmp) / "merged", base_model=a.model, dtype=a.dtype)
        print(f"merged model: {merged}" + ("" if a.merged else " (temporary)"))
        gguf = Path(a.gguf) if a.gguf else (Path(a.ollama) / "agent.gguf" if a.ollama else None)
        if gguf is not None:
            from mcp_rl.ship.gguf_export import gguf_summary, write_gguf

            start = time.monotonic()
            info = gguf_summary(write_gguf(merged, gguf, quant=a.quant))
            print(f"GGUF: {gguf} | {info['architecture']} {a.quant} | {info['bytes'] / 2**20:.0f} MiB | "
                  f"{time.monotonic() - start:.0f} s")
        if a.ollama:
            from mcp_rl.ship.ollama import write_modelfile

            modelfile = write_modelfile(a.ollama, gguf, name=a.name)
            print(f"Ollama Modelfile: {modelfile}\n  ollama create {a.name} -f {modelfile}\n  ollama run {a.name}")
        if a.push_to_hub:
            from huggingface_hub import HfApi

            from mcp_rl.keys import get_secret

            hub = HfApi(token=get_secret("HF_TOKEN"))
            hub.create_repo(a.push_to_hub, private=True, exist_ok=True)
            hub.upload_folder(folder_path=str(merged), repo_id=a.push_to_hub)
            print(f"pushed {merged} to https://huggingface.co/{a.push_to_hub} (private)")
    return 0


def add_export_parser(subparsers: Any) -> Any:
    """The `export` subcommand on cli.main's subparsers; sets `fn=cmd_export`."""
    sp = subparsers.add_parser("export", help="merge a run's LoRA into its base model (portable or ART run)",
                               description="Merge a LoRA into its base model and save it with its tokenizer, for vLLM, "
                               "transformers or a llama.cpp conversion. The LoRA itself needs no export: each portable "
                               "checkpoint's adapter/ folder, and ART's checkpoint folder, already is a peft adapter.")
    src = sp.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="a run folder (CLI or notebook, either backend): its newest checkpoint")
    src.add_argument("--adapter", help="the input LoRA: a checkpoint folder, ART's checkpoint folder "
                     "(<art_path>/<project>/models/<name>/checkpoints/NNNN) or a peft adapter folder")
    sp.add_argument("--model", help="base model (default: the one the adapter records; 'smollm2': the embedded one); "
                    "give the 16-bit base, never a 4-bit one")
    sp.add_argument("--merged", help="output folder (written atomically) for the merged model + tokenizer")
    sp.add_argument("--gguf", help="output GGUF file (llama.cpp, Ollama, LM Studio), written with the gguf package")
    sp.add_argument("--quant", choices=["f16", "q8_0"], default="q8_0", help="GGUF weights (default q8_0)")
    sp.add_argument("--ollama", help="output folder for an Ollama Modelfile (+ the GGUF, DIR/agent.gguf without --gguf)")
    sp.add_argument("--name", default="mcp-rl-agent", help="the Ollama model name in the printed commands")
    sp.add_argument("--push-to-hub", metavar="REPO", help="upload the merged model to a private Hub repository (HF_TOKEN)")
    sp.add_argument("--dtype", choices=["auto", "float16", "bfloat16", "float32"], default="auto",
                    help="weights of the merged model (auto: bf16 on a bf16 GPU, fp16 on other GPUs, fp32 without CUDA)")
    sp.set_defaults(fn=cmd_export)
    return sp
