"""Chained block hashing: each block's hash covers its tokens, extra keys and the whole prefix.

A block hash is ``hash_fn((parent_hash, token_ids, extra_keys))`` where ``parent_hash`` is the
previous block's hash (the chain seed for the first block), ``token_ids`` a tuple of ints and
``extra_keys`` a tuple of tagged tuples or None. Hashes are computed incrementally by a
``BlockHasher`` as tokens arrive; only full hash blocks are hashed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import cbor2

from pagedkv.errors import ConfigError

if TYPE_CHECKING:
    from pagedkv.runtime.request import Request

BlockHash = Hashable  # bytes for sha256_cbor / xxhash128, int for builtin
HashFn = Callable[[Any], Any]

# Chain seed of the first block. Same value in every process, so sha256_cbor and
# xxhash128 hashes can be compared across processes and machines.
DEFAULT_CHAIN_SEED = "pagedkv-chain-seed-v1"


class MultiModalFeature(NamedTuple):
    """A multimodal item (image, audio...) occupying ``[offset, offset + length)`` of the prompt."""

    identifier: str
    offset: int
    length: int


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding: identical on every machine and language."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash128(obj: Any) -> bytes:
    """xxh3-128 of the canonical CBOR encoding: faster, not collision-resistant against attacks."""
    import xxhash

    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


def builtin(obj: Any) -> int:
    """Python's ``hash``: fastest; string keys (LoRA, salt) vary with PYTHONHASHSEED."""
    return hash(obj)


HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256_cbor": sha256_cbor,
    "xxhash128": xxhash128,
    "builtin": builtin,
}


def get_hash_fn(name: str) -> HashFn:
    """The hash function called ``name``; ConfigError listing the known names otherwise."""
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        known = ", ".join(sorted(HASH_FUNCTIONS))
        raise ConfigError(f"unknown hash_algo {name!r}; known: {known}") from None


def block_extra_keys(
    request: Request, start: int, end: int, mm_index: int
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block ``[start, end)`` and the next multimodal item index to look at.

    LoRA name on every block, multimodal items overlapping the block (offset relative to
    the block start, may be negative), cache salt on the first block only.
    """
    keys: list[tuple[Any, ...]] = []
    if request.lora_name is not None:
        keys.append(("lora", request.lora_name))
    features = request.mm_features
    i = mm_index
    while i < len(features) and features[i].offset + features[i].length <= start:
        i += 1  # items entirely before this block are never needed again
    next_index = i
    while i < len(features) and features[i].offset < end:
        keys.append(("mm", features[i].identifier, features[i].offset - start))
        i += 1
    if start == 0 and request.cache_salt is not None:
        keys.append(("cache_salt", request.cache_salt))
    return (tuple(keys) if keys else None), next_index


class BlockHasher:
    """Computes a request's new full-block hashes from the tokens it has so far."""

    __slots__ = ("block_size", "hash_algo", "hash_fn", "none_hash")

    def __init__(
        self, block_size: int, hash_algo: str = "sha256_cbor", seed: str = DEFAULT_CHAIN_SEED
    ) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ConfigError(f"hash block_size must be a positive integer, got {block_size!r}")
        self.block_size = block_size
        self.hash_algo = hash_algo
        self.hash_fn = get_hash_fn(hash_algo)
        self.none_hash = self.hash_fn(seed)

    def __call__(self, request: Request) -> list[Any]:
        """Hashes of the full blocks after ``len(request.block_hashes)``."""
        bs = self.block_size
        hashes = request.block_hashes
        start = len(hashes) * bs
        tokens = request.all_token_ids
        end = len(tokens)
        if start + bs > end:
            return []
        fn = self.hash_fn
        parent = hashes[-1] if hashes else self.none_hash
        plain = request.lora_name is None and request.cache_salt is None and not request.mm_features
        mm_index = 0
        new: list[Any] = []
        while start + bs <= end:
            extra = None
            if not plain:
                extra, mm_index = block_extra_keys(request, start, start + bs, mm_index)
            parent = fn((parent, tuple(tokens[start : start + bs]), extra))
            new.append(parent)
            start += bs
        return new


def hash_token_blocks(
    token_ids: Sequence[int], block_size: int, hash_algo: str = "sha256_cbor"
) -> list[Any]:
    """Chained hashes of the full blocks of a plain token sequence (no extra keys)."""
    hasher = BlockHasher(block_size, hash_algo)
    fn = hasher.hash_fn
    parent = hasher.none_hash
    out = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = fn((parent, tuple(token_ids[start : start + block_size]), None))
        out.append(parent)
    return out
