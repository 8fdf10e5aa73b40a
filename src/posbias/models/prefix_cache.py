"""The KV-cache layers of prefix-shared scoring (models/prefix.py's `SharedKV`), written in place.

transformers' `DynamicLayer` concatenates the whole cache at every forward; these layers allocate their columns once
(`presized_layer`: a batch's spine columns and room for the columns it will append) and write new keys and values
into that buffer. `joined_layer` stacks the rows of several batches into one such layer, for a joined decode.
"""

from __future__ import annotations

import functools

import torch


@functools.cache
def _presized_class():
    """The cache layer class, built once (transformers is imported lazily in this module)."""
    from transformers.cache_utils import DynamicLayer

    class Presized(DynamicLayer):
        def __init__(self, k: torch.Tensor, v: torch.Tensor, n: int):
            """k, v [R, H, columns, D]: the buffers, allocated once; their first n columns in use."""
            super().__init__()
            self.k, self.v, self.n, self.device, self.is_initialized = k, v, n, k.device, True
            self.keys, self.values = k[:, :, :n], v[:, :, :n]

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            n, q = self.n, key_states.shape[-2]
            if n + q > self.k.shape[2]:  # past the room asked for: grow (as DynamicLayer would, once)
                self.k = torch.cat([self.k[:, :, :n], key_states.new_empty((*self.k.shape[:2], q, self.k.shape[3]))], 2)
                self.v = torch.cat([self.v[:, :, :n], value_states.new_empty((*self.v.shape[:2], q, self.v.shape[3]))], 2)
            self.k[:, :, n:n + q], self.v[:, :, n:n + q] = key_states, value_states
            self.n = n + q
            self.keys, self.values = self.k[:, :, :self.n], self.v[:, :, :self.n]
            return self.keys, self.values

    return Presized


def presized_layer(keys: torch.Tensor, values: torch.Tensor, room: int):
    """A cache layer holding `keys`/`values` [R, H, W, D] with room for `room` more columns, written in place
    (transformers' DynamicLayer concatenates the whole cache at every forward)."""
    r, h, w, _ = keys.shape
    k = keys.new_empty((r, h, w + room, keys.shape[-1]))
    v = values.new_empty((r, h, w + room, values.shape[-1]))
    k[:, :, :w], v[:, :, :w] = keys, values
    return _presized_class()(k, v, w)


def joined_layer(layers: list[tuple[torch.Tensor, torch.Tensor]], width: int, room: int):
    """One cache layer with the rows of `layers` ((keys, values) [R, H, columns, D] per part) stacked, each part's
    columns left-aligned in `width`, with room for `room` more. The columns a part does not fill are zeros (its rows'
    masks hide them, and a hidden column must not hold a NaN from uninitialised memory, which a masked softmax would
    still multiply)."""
    first, vfirst = layers[0]
    rows = sum(keys.shape[0] for keys, _ in layers)
    k = first.new_zeros((rows, first.shape[1], width + room, first.shape[3]))
    v = vfirst.new_zeros((rows, vfirst.shape[1], width + room, vfirst.shape[3]))
    r = 0
    for keys, values in layers:
        k[r:r + keys.shape[0], :, :keys.shape[2]], v[r:r + keys.shape[0], :, :keys.shape[2]] = keys, values
        r += keys.shape[0]
    return _presized_class()(k, v, width)
