"""Deterministic K/V per token prefix, so a prefix-cache hit reuses valid data.

A token's keys and values in a real model depend on every token before it. Here they
are random numbers seeded by a hash chained over the token ids up to and including the
token: two requests sharing a prefix produce identical K/V for it, whichever computed
it first, and a different earlier token changes everything after it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence

import torch

__all__ = [
    "chain_seeds",
    "TokenContent",
]


def chain_seeds(token_ids: Sequence[int], salt: int, known: list[int]) -> list[int]:
    """Extend ``known`` (seeds of a prefix of ``token_ids``) to one seed per token."""
    for token in token_ids[len(known) :]:
        previous = known[-1] if known else salt
        digest = hashlib.blake2b(
            previous.to_bytes(8, "little") + token.to_bytes(8, "little", signed=True),
            digest_size=8,
        ).digest()
        known.append(int.from_bytes(digest, "little") >> 1)
    return known


class TokenContent:
    """Per-layer K/V (or MLA latent) rows of each token, a pure function of its prefix.

    ``shapes`` maps a layer name to its row shapes: ``((H, D), (H, D))`` for keys and
    values, ``((D,),)`` for a latent. Rows are generated in ``dtype`` and cast to the
    cache dtype, exactly as they will be stored.
    """

    def __init__(
        self,
        shapes: Mapping[str, tuple[tuple[int, ...], ...]],
        cache_dtypes: Mapping[str, torch.dtype],
        *,
        salt: int = 0,
    ) -> None:
        self.shapes = dict(shapes)
        self.cache_dtypes = dict(cache_dtypes)
        self.salt = salt
        self._sizes = [math.prod(s) for name in self.shapes for s in self.shapes[name]]
        # index of each layer's first part in a token's flat list of parts
        starts = itertools.accumulate((len(parts) for parts in self.shapes.values()), initial=0)
        self._first = dict(zip(self.shapes, starts))
        self._seeds: dict[str, list[int]] = {}
        self._rows: dict[str, list[list[torch.Tensor]]] = {}

    def _token_rows(self, seed: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        flat = torch.randn(sum(self._sizes), generator=gen, dtype=torch.float64)
        return list(flat.split(self._sizes))

    def rows(self, key: str, token_ids: Sequence[int], end: int) -> list[list[torch.Tensor]]:
        """Rows of tokens ``[0, end)`` of the sequence ``token_ids`` cached under ``key``
        (a request id; its tokens may only be appended to)."""
        seeds = chain_seeds(token_ids[:end], self.salt, self._seeds.setdefault(key, []))
        rows = self._rows.setdefault(key, [])
        for seed in seeds[len(rows) : end]:
            rows.append(self._token_rows(seed))
        return rows[:end]

    def layer_rows(
        self, key: str, token_ids: Sequence[int], layer: str, start: int, end: int
    ) -> tuple[torch.Tensor, ...]:
        """Layer ``layer``'s K and V (or latent) rows of tokens ``[start, end)``, each
        ``[end - start, *shape]`` in float64, holding values the cache dtype stores exactly.

        Args:
            key: the sequence's cache key (a request id).
            token_ids: the sequence's token ids.
            layer: the layer's name.
            start: first token position.
            end: one past the last token position.
        """
        first = self._first[layer]
        rows = self.rows(key, token_ids, end)[start:end]
        dtype = self.cache_dtypes[layer]
        out = []
        for j, shape in enumerate(self.shapes[layer]):
            part = [r[first + j].view(shape) for r in rows]
            stacked = torch.stack(part) if part else torch.zeros((0, *shape), dtype=torch.float64)
            out.append(stacked.to(dtype).to(torch.float64))
        return tuple(out)

    def forget(self, key: str) -> None:
        self._seeds.pop(key, None)
        self._rows.pop(key, None)
