"""Diagnose why PortableTrainer(packed=True) kept the padded path for the Qwen2.5-3B shape on a GPU: run the
two probes (loss.backbone_and_head, packing.packing_works) and print the differences they compare."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "speed"))  # bench_update
from bench_update import model_of  # noqa: E402

from mcp_rl.training import packing  # noqa: E402
from mcp_rl.training.loss import backbone_and_head  # noqa: E402

for shape in sys.argv[1:] or ["qwen3b"]:
    m = model_of(shape, "cuda")
    ids = torch.arange(1, 5, device="cuda")[None]
    with torch.no_grad():
        full = m(input_ids=ids, use_cache=False).logits.float()
        split = m.get_output_embeddings()(m.model(input_ids=ids, use_cache=False).last_hidden_state).float()
    print(shape, "attn", m.config._attn_implementation, "| split probe:", backbone_and_head(m) is not None,
          "max|full|", full.abs().max().item(), "max diff", (full - split).abs().max().item(), flush=True)
    print(shape, "packing_works:", packing.packing_works(m.model), flush=True)
    bb = m.model
    a, b = torch.arange(3, 9, device="cuda"), torch.arange(11, 16, device="cuda")
    pos = torch.cat([torch.arange(len(a)), torch.arange(len(b))]).cuda()
    with torch.no_grad():
        packed = bb(input_ids=torch.cat([a, b])[None], position_ids=pos[None], use_cache=False).last_hidden_state[0].float()
        alone = torch.cat([bb(input_ids=x[None], use_cache=False).last_hidden_state[0] for x in (a, b)]).float()
        leak = bb(input_ids=torch.cat([a, b])[None], use_cache=False).last_hidden_state[0].float()
    rel = lambda x: ((x - alone).norm(dim=-1) / alone.norm(dim=-1)).max().item()  # noqa: E731
    print(shape, "packed vs alone: max rel per position", rel(packed), "max abs", (packed - alone).abs().max().item(),
          "| leaking (one causal row) max rel", rel(leak), flush=True)
    del m
    torch.cuda.empty_cache()
