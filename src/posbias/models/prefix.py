"""Forward passes that continue cached prefixes (prefix-shared scoring, issue 17): the transformers side.

`prefill` runs a batch of prefixes ("spines") once and keeps their keys/values; a `SharedKV` then
continues rows from them: row r sees the first `plen[r]` columns of its spine's cache, then its own
tokens. Every mask is built from key *positions* (-1: not visible), so causality, padding, the prefix
cut and sliding windows (Gemma-3, Mistral) follow one rule:

    a query at position q sees key column c  iff  0 <= kpos[c] <= q  and (no window, or q - kpos[c] < W)

(the window test is transformers' `sliding_window_overlay`, kv > q - W). Each query also sees its own
column, so a padding query never has an empty row (no NaN in padded rows, which no real row sees).
Masks go in ready-made (4D; one per layer type for models with `config.layer_types`), bypassing the
model's own mask builder, which assumes one cache length for the whole batch.
"""

from __future__ import annotations

import inspect

import torch


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _windows(model) -> dict[str, int | None] | int | None:
    """Per layer type its sliding window (None: full attention), or one window (None) for a single-mask model."""
    cfg = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types:
        return {t: (window if t == "sliding_attention" else None) for t in set(types)}
    return window if getattr(cfg, "model_type", "") == "mistral" else None


def _mask(kpos: torch.Tensor, qpos: torch.Tensor, window: int | None, dtype) -> torch.Tensor:
    """Mask [R, 1, Q, K] from key positions kpos [R, K] (-1: hidden) and query positions qpos [R, Q]; the last Q key
    columns are the queries' own. dtype torch.bool: True = visible (SDPA takes it as is, and its CPU kernel runs
    ~15% faster on it than on an additive mask); a float dtype: additive (0 or the dtype's minimum), for eager."""
    k, q = kpos[:, None, :], qpos[:, :, None]  # [R, 1, K], [R, Q, 1]
    ok = (k >= 0) & (k <= q)  # [R, Q, K]
    if window is not None:
        ok &= (q - k) < window
    n_q, n_k = qpos.shape[1], kpos.shape[1]
    idx = torch.arange(n_q, device=ok.device)
    ok[:, idx, n_k - n_q + idx] = True  # own column: never an empty row
    if dtype == torch.bool:
        return ok[:, None]
    return torch.zeros(ok.shape, dtype=dtype, device=ok.device).masked_fill(~ok, torch.finfo(dtype).min)[:, None]


def launch_bound(model) -> bool:
    """Whether the model runs on an accelerator, where a small model's forward costs mostly its fixed overhead
    (kernel launches, Python): there fewer, larger forwards win (spines batched, branches unchunked); on CPU the
    arithmetic dominates, so padding and the masked upper triangle are avoided instead (measured: docs/sweep.md)."""
    return next(model.parameters()).device.type != "cpu"


@torch.inference_mode()
def prefill(model, spines: list[list[int]], pad_id: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys/values of each spine, right-padded so column t holds position t: per layer (k, v) [E, H, P, D].
    On CPU one unpadded forward per spine (no padding to compute); on an accelerator one forward for all of them:
    right padding under plain causal attention changes no real column (a pad sits after every real token)."""
    from transformers import DynamicCache

    seqs = [s or [pad_id] for s in spines]  # an empty spine (no shared prefix) keeps one hidden column
    width = max(map(len, seqs))
    dev = next(model.parameters()).device
    kw = {"logits_to_keep": 1} if _keeps_logits(model) else {}
    parts = [[s + [pad_id] * (width - len(s)) for s in seqs]] if launch_bound(model) else [[s] for s in seqs]
    per: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    for part in parts:
        ids = torch.tensor(part, dtype=torch.long, device=dev)  # [e, P]
        cache = DynamicCache()  # plain layers: sliding-window layers keep every column too (our masks cut them)
        model(input_ids=ids, position_ids=torch.arange(ids.shape[1], device=dev)[None].expand(len(part), -1),
              past_key_values=cache, use_cache=True, **kw)
        per.append([(layer.keys, layer.values) for layer in cache.layers])

    def stack(i: int, j: int) -> torch.Tensor:  # layer i, keys (0) or values (1): [E, H, width, D]
        return torch.cat([torch.nn.functional.pad(p[i][j], (0, 0, 0, width - p[i][j].shape[2])) for p in per])

    return [(stack(i, 0), stack(i, 1)) for i in range(len(per[0]))]


class SharedKV:
    """Rows that continue cached spines: `forward` appends tokens to every row and returns their logits."""

    def __init__(self, model, spine_kv: list[tuple[torch.Tensor, torch.Tensor]], owner: torch.Tensor,
                 plen: torch.Tensor):
        """owner [R]: each row's spine (index into the prefill batch); plen [R]: how many spine columns it sees."""
        from transformers import DynamicCache

        self.model = model
        dev = next(model.parameters()).device  # the inputs' device (a spread model: each layer's KV stays on its own)
        plen = plen.to(dev)
        width = max(1, int(plen.max()))

        def rows(t: torch.Tensor) -> torch.Tensor:  # [E, H, P, D] -> [R, H, width, D], on the layer's device
            return t.index_select(0, owner.to(t.device))[:, :, :width].contiguous()

        # a copy, so a batch holds R x width columns of KV per layer
        self.cache = DynamicCache(ddp_cache_data=[(rows(k), rows(v)) for k, v in spine_kv])
        cols = torch.arange(width, device=dev)
        self.kpos = torch.where(cols[None] < plen[:, None], cols[None], -1)  # [R, width]
        self.windows = _windows(model)
        sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.dtype = torch.bool if sdpa else spine_kv[0][0].dtype  # the mask's: boolean for SDPA, else additive

    def _masks(self, kpos: torch.Tensor, qpos: torch.Tensor):
        if isinstance(self.windows, dict):
            return {t: _mask(kpos, qpos, w, self.dtype) for t, w in self.windows.items()}
        return _mask(kpos, qpos, self.windows, self.dtype)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, qpos: torch.Tensor, valid: torch.Tensor, keep: int | None = None) -> torch.Tensor:
        """ids, qpos, valid [R, Q]: new tokens, their positions, and which are real (not padding).
        -> logits of the last `keep` columns (all if None) [R, keep, V], in the model's dtype."""
        dev = self.kpos.device
        ids, qpos, valid = ids.to(dev), qpos.to(dev), valid.to(dev)
        kpos = torch.cat([self.kpos, torch.where(valid, qpos, -1)], dim=1)  # [R, K + Q]
        kw = {"logits_to_keep": keep} if keep and _keeps_logits(self.model) else {}
        out = self.model(input_ids=ids, attention_mask=self._masks(kpos, qpos), position_ids=qpos.clamp(min=0),
                         past_key_values=self.cache, use_cache=True, **kw)
        self.kpos = kpos
        return out.logits if keep is None else out.logits[:, -keep:]

    def extend(self, ids: torch.Tensor, qpos: torch.Tensor, valid: torch.Tensor, keep: int, chunk: int = 256) -> torch.Tensor:
        """As forward, in column chunks of `chunk` (the last one at least `keep` wide): a masked attention computes
        every (query, key) pair, so one long branch would pay for its whole upper triangle; chunks pay chunk / 2
        keys per query instead. -> logits of the last `keep` columns [R, keep, V]."""
        if launch_bound(self.model):  # an accelerator: one forward (its fixed cost dominates, not the triangle)
            chunk = ids.shape[1]
        width, chunk = ids.shape[1], max(chunk, keep)
        cuts = list(range(width - chunk, 0, -chunk))[::-1]  # chunk starts, counted from the right
        for a, b in zip([0] + cuts, cuts):
            self.forward(ids[:, a:b], qpos[:, a:b], valid[:, a:b], keep=1)
        a = cuts[-1] if cuts else 0
        return self.forward(ids[:, a:], qpos[:, a:], valid[:, a:], keep=keep)
