"""Forward passes that continue cached prefixes (prefix-shared scoring): the transformers side.

`prefill` runs a batch of prefixes ("spines") once and keeps their keys/values; a `SharedKV` then
continues rows from them: row r sees the first `plen[r]` columns of its spine's cache, then its own
tokens. Every mask is built from key *positions* (-1: not visible), so causality, padding, the prefix
cut and sliding windows (Gemma-2/3, Qwen2/3 `layer_types`; Mistral, Mixtral, Phi-3, Starcoder2 `sliding_window`)
follow one rule:

    a query at position q sees key column c  iff  0 <= kpos[c] <= q  and (no window, or q - kpos[c] < W)

(the window test is transformers' `sliding_window_overlay`, kv > q - W). Each query also sees its own
column, so a padding query never has an empty row (no NaN in padded rows, which no real row sees).
Masks go in ready-made (4D; one per layer type for models with `config.layer_types`), bypassing the
model's own mask builder, which assumes one cache length for the whole batch.

`prefix_exact` decides, per model, whether this reproduces the plain path (the Scorer falls back with its note
where it does not): RoPE whose frequencies depend on the sequence length (dynamic, longrope), layer kinds other
than full and sliding, and unknown position schemes fall back. tests/test_model_families.py checks each family.
"""

from __future__ import annotations

import inspect

import torch

from .compat import ATTEND, cache_key, takes_hook
from .prefix_cache import joined_layer, presized_layer
from .rope import LENGTH_DEPENDENT


def _keeps_logits(model) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _text_config(model):
    return model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config


# layer kinds whose mask the shared path builds itself; any other (chunked, linear, ...) falls back
_LAYER_KINDS = ("full_attention", "sliding_attention")
_ABSOLUTE = ("gpt2",)  # learned absolute positions read from position_ids (checked by the family suite)


def _window_plan(model) -> tuple[dict[str, int | None] | int | None, str | None]:
    """(per layer type its sliding window, or one window for a single-mask model; None: full attention), and
    why the shared path cannot build the model's own masks (None: it can). A model without `layer_types` applies
    `config.sliding_window` to every layer when its modeling code builds sliding masks (Mistral, Mixtral, Phi-3,
    Starcoder2); one whose code builds none would get a window here that its plain path lacks, so it falls back."""
    import sys

    cfg = _text_config(model)
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if types:
        odd = sorted(set(types) - set(_LAYER_KINDS))
        if odd:
            return None, f"layer type {odd[0]!r}, whose mask the shared path does not build"
        if "sliding_attention" in types and not isinstance(window, int):
            return None, "sliding layers without an integer config.sliding_window"
        return {t: (window if t == "sliding_attention" else None) for t in set(types)}, None
    if getattr(cfg, "attention_chunk_size", None):
        return None, "chunked attention (config.attention_chunk_size)"
    if window is None or getattr(cfg, "use_sliding_window", True) is False:
        return None, None
    code = sys.modules.get(type(getattr(model, "base_model", model)).__module__)
    if not hasattr(code, "create_sliding_window_causal_mask"):
        return None, f"config.sliding_window={window} with modeling code whose window rule posbias has not checked"
    return int(window), None


def prefix_exact(model) -> str | None:
    """None if prefix-shared scoring gives this model's plain-path logits, else why not (one line, for the run's
    record). Exact needs: positions that a cached key keeps (static RoPE, or learned absolute positions read from
    position_ids), masks the shared path can build (full, or sliding with a known window), and an attention backend
    that takes them (sdpa, eager)."""
    cfg, base = _text_config(model), getattr(model, "base_model", model)
    mtype = getattr(cfg, "model_type", type(model).__name__)
    rot = getattr(base, "rotary_emb", None)
    if rot is not None:
        kinds = getattr(rot, "rope_type", "default")
        for kind in (kinds.values() if isinstance(kinds, dict) else [kinds]):
            if any(d in str(kind) for d in LENGTH_DEPENDENT):
                return (f"{mtype}: rope_type {str(kind)!r} recomputes the RoPE frequencies from the sequence length, so a "
                        "cached prefix is rotated as a shorter sequence than the whole row")
    elif mtype not in _ABSOLUTE:
        return f"{mtype}: no rotary embedding and no learned positions that posbias has checked for prefix sharing"
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return f"{mtype}: forward takes no position_ids"
    impl = getattr(model.config, "_attn_implementation", None)
    if impl not in ("sdpa", "eager"):
        return f"{mtype}: attention implementation {impl!r} (the shared path's masks need sdpa or eager)"
    why = _window_plan(model)[1]
    return f"{mtype}: {why}" if why else None


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
              use_cache=True, **{cache_key(model): cache}, **kw)
        per.append([(layer.keys, layer.values) for layer in cache.layers])

    def stack(i: int, j: int) -> torch.Tensor:  # layer i, keys (0) or values (1): [E, H, width, D]
        return torch.cat([torch.nn.functional.pad(p[i][j], (0, 0, 0, width - p[i][j].shape[2])) for p in per])

    return [(stack(i, 0), stack(i, 1)) for i in range(len(per[0]))]


def split_attention(model) -> str | None:
    """None if SharedKV can run split attention for this model, else why not (one line). Split: a branch's queries
    attend to its spine's keys and values where the spine holds them (no copy per branch) and to the branch's own
    keys in a second call, causal by the kernel's own rule where nothing is padded (no mask, no masked upper
    triangle, so a long branch needs no chunks); the two partial softmaxes are merged by their log-sum-exps, as
    cascade attention does. It needs torch's CPU flash kernel (which returns the log-sum-exp), the registered sdpa
    that reads ATTEND (models/compat.py), and full attention in every layer (a window would hide spine columns
    per query)."""
    if launch_bound(model):
        return "an accelerator (its own kernels; one forward per branch batch)"
    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return "attention implementation is not sdpa"
    windows = _window_plan(model)[0]
    if (windows is not None if not isinstance(windows, dict) else any(w is not None for w in windows.values())):
        return "sliding-window layers"
    if not hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu"):
        return "this torch has no CPU flash kernel that returns the log-sum-exp"
    if not takes_hook():
        return "the registered sdpa is not posbias's (models/compat.install_grouped_sdpa)"
    return None


def _merge(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor) -> torch.Tensor:
    """Two attentions of the same queries over disjoint key sets, o [R, H, Q, D] with log-sum-exps l [R, H, Q]
    (fp32), as one attention over both: each weighted by its share of the total softmax mass. -> [R, H, Q, D]
    in o1's dtype."""
    total = torch.logaddexp(l1, l2)
    w1, w2 = torch.exp(l1 - total)[..., None], torch.exp(l2 - total)[..., None]
    return (o1.float() * w1 + o2.float() * w2).to(o1.dtype)


_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)  # -> (output, log-sum-exp)


class SharedKV:
    """Rows that continue cached spines: `forward` appends tokens to every row and returns their logits."""

    def __init__(self, model, spine_kv: list[tuple[torch.Tensor, torch.Tensor]], owner: torch.Tensor,
                 plen: torch.Tensor, room: int = 0, split: bool = False):
        """owner [R]: each row's spine (index into the prefill batch); plen [R]: how many spine columns it sees;
        room: how many columns the rows will append in all (their branches, new tokens), allocated once.
        split: split attention (`split_attention`; the caller has checked the model) where the rows continue one
        spine: its columns are read where they lie (a view) and the cache holds only the rows' own columns.
        Otherwise (copy) every row's spine columns are copied into its cache, and one masked attention reads both."""
        from transformers import DynamicCache

        self.model = model
        dev = next(model.parameters()).device  # the inputs' device (a spread model: each layer's KV stays on its own)
        plen = plen.to(dev)
        width = max(1, int(plen.max()))
        # split only where every row reads one spine (a view; rows from several would need their spine columns
        # gathered, a copy, and there one masked attention costs less than two: docs/sweep.md, "Split attention")
        # and every row reads some of it (a row with no spine column would attend to nothing there)
        self.split = split and bool((owner == owner[0]).all()) and bool((plen > 0).all())

        def rows(t: torch.Tensor) -> torch.Tensor:  # [E, H, P, D] -> [R, H, width, D], on the layer's device
            return t[:, :, :width].index_select(0, owner.to(t.device))

        self.windows = _window_plan(model)[0]
        sdpa = getattr(model.config, "_attn_implementation", None) == "sdpa"
        self.dtype = torch.bool if sdpa else spine_kv[0][0].dtype  # the mask's: boolean for SDPA, else additive
        cols = torch.arange(width, device=dev)
        spine_pos = torch.where(cols[None] < plen[:, None], cols[None], -1)  # [R, width]
        self.cache = DynamicCache()
        if self.split:
            self._read_in_place(spine_kv, int(owner[0]), spine_pos)
            empty = lambda t: t.new_empty((len(owner), t.shape[1], 0, t.shape[3]))  # noqa: E731
            self.cache.layers = [presized_layer(empty(k), empty(v), room) for k, v in spine_kv]
            self.kpos = spine_pos[:, :0]  # [R, 0]: the rows' own columns, none yet
        else:  # a batch holds R x (width + room) columns of KV per layer, appended in place
            self.cache.layers = [presized_layer(rows(k), rows(v), room) for k, v in spine_kv]
            self.kpos = spine_pos

    @classmethod
    def joined(cls, parts: list["SharedKV"], room: int) -> "SharedKV":
        """The rows of `parts` as one batch (their order kept), each part's columns as they are, the shorter parts'
        rows padded with hidden columns; room: the columns the joined rows will append (their new tokens). Used to
        decode the rows of several branch batches together (scoring/generate.py): a decode step reads every weight
        once however many rows it carries, so fewer, fuller steps cost less per row."""
        from transformers import DynamicCache

        out = cls.__new__(cls)
        out.model, out.windows, out.dtype = parts[0].model, parts[0].windows, parts[0].dtype
        # split parts that all continue one spine stay split: the spine read in place for every row, only the parts'
        # own columns joined; otherwise every row's spine and own columns are copied into the joined cache
        spine, e = getattr(parts[0], "source", (None, None))
        out.split = all(p.split and p.source[0] is spine and p.source[1] == e for p in parts)
        pad = lambda k, width: torch.nn.functional.pad(k, (0, width - k.shape[1]), value=-1)  # noqa: E731
        if out.split:
            width = max(p.spine_pos.shape[1] for p in parts)
            out._read_in_place(spine, e, torch.cat([pad(p.spine_pos, width) for p in parts]))
            kpos, kv = [p.kpos for p in parts], lambda p, i: (p.cache.layers[i].keys, p.cache.layers[i].values)
        else:
            kpos, kv = [p.columns() for p in parts], lambda p, i: p.layer(i)
        width = max(k.shape[1] for k in kpos)
        out.kpos = torch.cat([pad(k, width) for k in kpos])
        out.cache = DynamicCache()
        out.cache.layers = [joined_layer([kv(p, i) for p in parts], width, room) for i in range(len(parts[0].cache.layers))]
        return out

    def _read_in_place(self, spine_kv: list[tuple[torch.Tensor, torch.Tensor]], e: int, spine_pos: torch.Tensor) -> None:
        """Split: the rows read spine e's columns where the prefill left them (a view, the batch broadcast: no copy);
        spine_pos [R, P]: each row's key positions there, -1 past its cut (hidden by spine_mask, None if none is)."""
        self.source, self.spine_pos = (spine_kv, e), spine_pos
        r, width = spine_pos.shape
        self.spine = [(k[e:e + 1, :, :width].expand(r, -1, -1, -1), v[e:e + 1, :, :width].expand(r, -1, -1, -1))
                      for k, v in spine_kv]
        self.dtype = spine_kv[0][0].dtype  # the kernel called directly takes additive masks in the query's dtype
        hidden = (spine_pos < 0)[:, None, None, :]  # [R, 1, 1, P]: columns past a row's cut
        self.spine_mask = None if not bool(hidden.any()) else \
            torch.zeros(hidden.shape, dtype=self.dtype, device=spine_pos.device).masked_fill(hidden, torch.finfo(self.dtype).min)

    def columns(self) -> torch.Tensor:
        """Every column's key position, spine's and own [R, K] (-1: hidden), as `layer` lays them out."""
        return torch.cat([self.spine_pos, self.kpos], dim=1) if self.split else self.kpos

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values over `columns` [R, H, K, D] (split: the spine's and the own joined, a copy)."""
        own = self.cache.layers[i]
        if not self.split:
            return own.keys, own.values
        k, v = self.spine[i]
        return torch.cat([k, own.keys], dim=2), torch.cat([v, own.values], dim=2)

    def _attend(self, module, query, key, value, mask, kwargs):
        """Split attention for one layer (split_attention): query [R, H, Q, D] over the spine's columns (every one
        visible but those past a row's cut: spine_mask) and over key, value, the rows' own columns (mask, or
        None: causal by the kernel's rule where the queries are all the columns, else all visible), merged.
        -> (output [R, Q, H, D], None), as transformers' sdpa returns it."""
        if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None or kwargs.get("output_attentions"):
            raise RuntimeError("split attention takes no position bias, softcap or attention output")  # split_attention
        self._reached += 1
        sk, sv = self.spine[module.layer_idx]
        scale, q = kwargs.get("scaling"), query.shape[2]
        o1, l1 = _FLASH(query, sk, sv, attn_mask=self.spine_mask, scale=scale)
        if mask is self._plain:
            o2, l2 = _FLASH(query, key, value, is_causal=q > 1 and q == key.shape[2], scale=scale)
        else:
            o2, l2 = _FLASH(query, key, value, attn_mask=mask, scale=scale)
        return _merge(o1, l1, o2, l2).transpose(1, 2).contiguous(), None

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
        # split: the own columns' mask, none where the kernel's causal rule (or no rule) is exact; then a 4D stand-in
        # the model passes through unread (create_causal_mask returns a 4D mask as is), which _attend recognises
        plain = self.split and bool(valid.all()) and (
            self.kpos.shape[1] == 0 or (ids.shape[1] == 1 and bool((self.kpos >= 0).all())))
        self._plain = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=dev).expand(
            len(ids), 1, ids.shape[1], kpos.shape[1]) if plain else None
        masks = self._masks(kpos, qpos) if not plain else \
            dict.fromkeys(self.windows, self._plain) if isinstance(self.windows, dict) else self._plain
        token, self._reached = ATTEND.set(self._attend if self.split else None), 0
        try:
            out = self.model(input_ids=ids, attention_mask=masks, position_ids=qpos.clamp(min=0), use_cache=True,
                             **{cache_key(self.model): self.cache}, **kw)
        finally:
            ATTEND.reset(token)
        if self.split and self._reached != len(self.spine):  # an attention that never read the spine: wrong logits
            raise RuntimeError(f"split attention reached {self._reached} of {len(self.spine)} layers (something "
                               "replaced posbias's registered sdpa after the check); pass prefix_attention='copy'")
        self.kpos = kpos
        return out.logits if keep is None else out.logits[:, -keep:]

    def extend(self, ids: torch.Tensor, qpos: torch.Tensor, valid: torch.Tensor, keep: int, chunk: int = 256) -> torch.Tensor:
        """As forward, in column chunks of `chunk` (the last one at least `keep` wide): a masked attention computes
        every (query, key) pair, so one long branch would pay for its whole upper triangle; chunks pay chunk / 2
        keys per query instead. -> logits of the last `keep` columns [R, keep, V]."""
        if launch_bound(self.model):  # an accelerator: one forward (its fixed cost dominates, not the triangle)
            chunk = ids.shape[1]
        elif self.split and self.kpos.shape[1] == 0 and bool(valid.all()):  # causal by the kernel: no triangle to skip
            chunk = ids.shape[1]
        width, chunk = ids.shape[1], max(chunk, keep)
        cuts = list(range(width - chunk, 0, -chunk))[::-1]  # chunk starts, counted from the right
        for a, b in zip([0] + cuts, cuts):
            self.forward(ids[:, a:b], qpos[:, a:b], valid[:, a:b], keep=1)
        a = cuts[-1] if cuts else 0
        return self.forward(ids[:, a:], qpos[:, a:], valid[:, a:], keep=keep)
