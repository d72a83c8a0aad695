"""The batched decode step behind LocalPolicy: a StaticCache and a one-token forward, a CUDA graph on a GPU.

Internal to local_policy.py; `python bench/checks/check_cuda_graph.py` checks on a GPU that graph and
eager decoding give the same tokens.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any


def _cache_kwarg(model: Any) -> str:
    """transformers 5.24 calls the KV cache `cache`; older ones (the GPU machine's 5.17) `past_key_values`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def stop_string_end(tokenizer: Any, tokens: list[int], stop: str) -> int | None:
    """How many of `tokens` it takes for their text to contain `stop`, or None.

    >>> class T:
    ...     def decode(self, ids, skip_special_tokens=False): return "".join(chr(i) for i in ids)
    >>> stop_string_end(T(), [ord(c) for c in "ab</x>cd"], "</x>"), stop_string_end(T(), [97], "</x>")
    (6, None)
    """
    if stop not in tokenizer.decode(tokens, skip_special_tokens=False):
        return None
    return next(end for end in range(1, len(tokens) + 1)
                if stop in tokenizer.decode(tokens[:end], skip_special_tokens=False))


def sliding_window(config: Any) -> int | None:
    """The window of a model whose layers mix sliding-window and full attention (Gemma 3), else None.

    >>> class C: layer_types, sliding_window = ["sliding_attention", "full_attention"], 512
    >>> sliding_window(C()), sliding_window(object())
    (512, None)
    """
    types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    return int(window) if window and "sliding_attention" in types else None


def _full_attention(config: Any) -> Any:
    """`config` with every layer's cache full length: the sliding window is then the mask's job.

    transformers gives sliding layers a rolling cache of `sliding_window` columns, which a mask over the
    whole cache (what makes the decode step fixed-shape) cannot index; a full-length cache can."""
    if sliding_window(config) is None:
        return config
    import copy

    config = copy.deepcopy(config)
    config.layer_types = ["full_attention"] * len(config.layer_types)
    config.sliding_window = None
    return config


def packed_gqa_sdpa(sdpa: Any) -> Any:
    """transformers' `sdpa_attention_forward`, but a one-token query with a mask attends without `repeat_kv`.

    With grouped-query attention and a mask, transformers before 5.2x copies every key/value head
    `num_key_value_groups` times for SDPA (its GQA mode needs mask=None on CUDA): for a decode step
    over a StaticCache that copy is the whole cache, every step, every layer (SmolLM2: 3x). A single
    query token needs no copy: its heads fold onto the key/value heads as query rows, the mask
    broadcasts. Newer transformers do the same (`pack_gqa`); this is that, for the GPU machine's and
    Unsloth's transformers 5.17. Anything else goes to `sdpa` unchanged.

    >>> import torch
    >>> class M: num_key_value_groups = 3
    >>> q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    >>> mask = torch.zeros(2, 1, 1, 5); mask[0, ..., :2] = float("-inf")
    >>> out, _ = packed_gqa_sdpa(None)(M(), q, k, v, mask)
    >>> ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1),
    ...                                                        attn_mask=mask).transpose(1, 2)
    >>> out.shape, torch.allclose(out, ref, atol=1e-6)
    (torch.Size([2, 1, 6, 8]), True)
    """
    import torch

    def forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any) -> tuple[Any, None]:
        groups = getattr(module, "num_key_value_groups", 1)
        if (groups == 1 or query.shape[2] != 1 or attention_mask is None or attention_mask.shape[1] != 1
                or kwargs.get("position_bias") is not None or kwargs.get("output_attentions")):
            return sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                        is_causal=is_causal, **kwargs)
        batch, heads, _, dim = query.shape  # query head h reads key/value head h // groups, as repeat_kv pairs them
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, heads // groups, groups, dim), key, value,
            attn_mask=attention_mask[:, :, :, : key.shape[-2]], dropout_p=dropout, scale=scaling)
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None

    return forward


def _install_packed_gqa() -> None:
    """Register `packed_gqa_sdpa` as transformers' "sdpa" where transformers does not pack GQA itself."""
    from transformers import AttentionInterface
    from transformers.integrations import sdpa_attention

    if hasattr(sdpa_attention, "pack_gqa") or getattr(AttentionInterface._global_mapping["sdpa"], "_mcp_rl", False):
        return
    forward = packed_gqa_sdpa(AttentionInterface._global_mapping["sdpa"])
    forward._mcp_rl = True
    AttentionInterface.register("sdpa", forward)


_COMPILED: Any = None  # the compiled `_one_token`; False once compiling failed in this process
_COMPILE_LOCK = threading.Lock()  # dynamo and Inductor are not thread-safe: one decode thread compiles at a time


def _one_token(model: Any, ids: Any, mask: Any, positions: Any, cache_kw: str, cache: Any) -> Any:
    return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                 **{cache_kw: cache}).logits


def _compiled_one_token() -> Any:
    """`_one_token` through torch.compile, one per process. A decode step's kernels are mostly small
    elementwise ops (norms, rotary, activations, the LoRA adds) that a CUDA graph replays one by one;
    Inductor fuses them. Shapes are left to dynamo's automatic dynamic: the first batch compiles for its
    shape, a batch of another shape recompiles with the sizes that changed made symbolic, and later
    batches reuse that (transformers' StaticCache is built for this: in-place updates, static addresses).
    Anything else its guards see new compiles once more: a one-row batch, another model, the adapter
    switched off. Past dynamo's recompile limit (8) a step runs uncompiled, with dynamo's warning.
    Prefill stays eager: its window changes every batch."""
    global _COMPILED
    if _COMPILED is None:
        import torch

        _COMPILED = torch.compile(_one_token)
    return _COMPILED


class Decoder:
    """One batch's KV cache and its one-token forward, replayed as a CUDA graph on a GPU.

    The cache is transformers' StaticCache (fixed shape, updated in place); the attention mask
    is a 4-D additive mask over the whole cache, which transformers uses as given, so a decode
    step has fixed shapes and no host sync: what graph capture needs. The graph is captured
    per batch (two eager forwards), so it always reads the adapter weights in place: the
    trainer's in-place updates are what the next batch samples from. Where capture fails
    (a quantized layer that syncs, say) the step runs eagerly, slower but the same. `compiled` runs the
    one-token forward through torch.compile (`_compiled_one_token`), captured the same way; where
    compiling fails the step runs uncompiled.
    """

    def __init__(self, model: Any, ids: Any, keep: Any, length: int, *, cuda_graph: bool, compiled: bool = False):
        import torch
        from transformers import StaticCache

        _install_packed_gqa()
        self.model, self.ids, self.keep, self.cuda_graph, self.compiled = model, ids, keep, cuda_graph, compiled
        self.cache_kw = _cache_kwarg(model)
        self.window = sliding_window(model.config)
        self.cache = StaticCache(config=_full_attention(model.config), max_cache_len=length)
        dtype = model.get_input_embeddings().weight.dtype
        n, width = ids.shape
        self.neg = torch.finfo(dtype).min
        self.positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        self.mask = torch.full((n, 1, 1, length), self.neg, dtype=dtype, device=ids.device)
        self.mask[:, 0, 0, :width].masked_fill_(keep, 0.0)
        self.smask = None
        if self.window is not None:  # the first decode step's query sits in column `width`
            self.smask = self.mask.clone()
            self.smask[:, 0, 0, : max(0, width - self.window)] = self.neg
        self.graph, self.out = None, None

    def _forward(self, ids: Any, mask: Any, smask: Any, positions: Any, keep_logits: int) -> Any:
        if smask is not None:  # a model with sliding-window layers takes one prepared mask per layer type
            mask = {"full_attention": mask, "sliding_attention": smask}
        return self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          logits_to_keep=keep_logits, **{self.cache_kw: self.cache}).logits

    def _one(self) -> Any:
        """The one-token forward on the step's buffers (compiled if asked and compiling works)."""
        global _COMPILED
        import torch

        mask = self.mask if self.smask is None else {"full_attention": self.mask, "sliding_attention": self.smask}
        if self.compiled and _COMPILED is not False:
            lengths = [layer.cumulative_length.clone() for layer in self.cache.layers
                       if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor)]
            try:
                with _COMPILE_LOCK:
                    return _compiled_one_token()(self.model, self.step_ids, mask, self.step_pos, self.cache_kw,
                                                 self.cache)
            except Exception as e:  # noqa: BLE001 - no compiler, an unsupported op: the same step uncompiled
                if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                    raise  # inside graph capture: the capture is spoilt, `_capture` decodes without a graph
                import logging

                logging.getLogger(__name__).warning(
                    "torch.compile of the decode step failed (%s: %s); decoding uncompiled from now on (set "
                    "policy_compile_decode=false to skip it)", type(e).__name__, str(e)[:200])
                _COMPILED = False
                for layer, n in zip(self.cache.layers, lengths):  # a step cut short may have moved the cache on
                    layer.cumulative_length.copy_(n)
        self.compiled = self.compiled and _COMPILED is not False
        return _one_token(self.model, self.step_ids, mask, self.step_pos, self.cache_kw, self.cache)

    def prefill(self, n_forced: int, window: int | None = None, copies: list = ()) -> tuple[Any, Any]:
        """Logits for the first new token, and the forced prefix's logprobs (or None).

        Runs the last `window` prompt columns (default: all); `copies` (prefix_cache.Plan) fill the
        cache columns left of it with keys and values kept from earlier turns."""
        import torch

        n, width = self.ids.shape
        window = width if window is None else window
        if copies:
            self._fill(copies, width - window)
        cols = torch.arange(width, device=self.ids.device)
        query = cols[width - window:, None]  # the window's columns, as query rows
        causal, own = cols[None, :] <= query, cols[None, :] == query
        # A padding row attends to itself: a row with nothing to attend to would give NaN keys.
        allowed = (causal & self.keep[:, None, :]) | own
        mask = self.mask.new_full((n, 1, window, self.mask.shape[-1]), self.neg)
        mask[:, 0, :, :width].masked_fill_(allowed, 0.0)
        smask = None
        if self.window is not None:  # key column k is in query column q's window when q - k < window
            near = causal & (query - cols[None, :] < self.window)
            smask = mask.new_full(mask.shape, self.neg)
            smask[:, 0, :, :width].masked_fill_(allowed & near | own, 0.0)
        logits = self._forward(self.ids[:, width - window:], mask, smask, self.positions[:, width - window:],
                               n_forced + 1)
        forced = None
        if n_forced:
            forced = torch.log_softmax(logits[:, :-1].float(), -1).gather(
                -1, self.ids[:, -n_forced:, None]).squeeze(-1)
        # Contiguous: a one-row slice keeps the wide row's stride, which a compiled step would guard on.
        self.step_ids = self.ids[:, -1:].clone(memory_format=torch.contiguous_format)
        self.step_pos = self.positions[:, -1:].clone(memory_format=torch.contiguous_format)
        if self.cuda_graph:
            self._capture()
        return logits[:, -1], forced

    def _fill(self, copies: list, start: int) -> None:
        """Write kept keys and values into the cache, which then writes the prefill from column `start` on.

        By hand: in transformers 5.17 and 5.24 a StaticCache can only crop its length (batch selection,
        `batch_select_indices`, is DynamicCache's, and a decode over a DynamicCache has no fixed shape to
        replay as a CUDA graph); nothing writes given states into some rows' columns. Its layers allocate on
        first write (`lazy_initialization`, given a tensor of the states' shape) and write at `cumulative_length`."""
        n = self.ids.shape[0]
        for layer, (k, v) in zip(self.cache.layers, copies[0][2]):
            layer.lazy_initialization(k.new_zeros((n, k.shape[0], 0, k.shape[-1])),
                                      v.new_zeros((n, v.shape[0], 0, v.shape[-1])))
            layer.cumulative_length.fill_(start)
        for row, column, kv, count in copies:
            for layer, (k, v) in zip(self.cache.layers, kv):
                layer.keys[row, :, column:column + count] = k[:, :count]
                layer.values[row, :, column:column + count] = v[:, :count]

    def kept(self, row: int, start: int, end: int) -> list:
        """Row `row`'s keys and values of cache columns [start, end), per layer, as copies to keep."""
        return [(layer.keys[row, :, start:end].clone(), layer.values[row, :, start:end].clone())
                for layer in self.cache.layers]

    def _capture(self) -> None:
        import torch

        lengths: list = []
        try:  # a cache without per-layer lengths (another transformers) also falls back to eager
            lengths = [layer.cumulative_length.clone() for layer in self.cache.layers]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires (and compiling)
                self._one()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.out = self._one()
            self.graph = graph
        except Exception as e:  # noqa: BLE001 - any capture failure: decode eagerly instead
            import logging

            logging.getLogger(__name__).warning("CUDA graph capture failed (%s: %s); decoding eagerly",
                                                type(e).__name__, e)
            self.graph = None
        for layer, n in zip(self.cache.layers, lengths):  # the warm-up wrote one throwaway column
            layer.cumulative_length.copy_(n)

    def step(self, tokens: Any, column: int) -> Any:
        """Feed one token per row (it lands in cache `column`); logits for the next."""
        self.step_ids.copy_(tokens[:, None])
        self.step_pos.add_(1)
        self.mask[:, :, :, column] = 0.0
        if self.smask is not None:
            self.smask[:, :, :, column] = 0.0
            if column >= self.window:
                self.smask[:, :, :, column - self.window] = self.neg
        if self.graph is not None:
            self.graph.replay()
            return self.out[:, -1]
        return self._one()[:, -1]
