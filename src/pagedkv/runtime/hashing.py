"""Chained block hashing, byte-identical to vLLM 0.33's for the same algorithm: block
``i``'s hash is ``hash_fn((hash of block i-1 or none_hash, token_ids, extra_keys))``."""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeAlias

import cbor2

from pagedkv.errors import ConfigError

__all__ = [
    "BlockHash",
    "HashFn",
    "DEFAULT_NONE_HASH_SEED",
    "MultiModalFeature",
    "LoRA",
    "HashedRequest",
    "sha256",
    "sha256_cbor",
    "xxhash",
    "xxhash_cbor",
    "xxhash128",
    "builtin",
    "HASH_FUNCTIONS",
    "get_hash_fn",
    "none_hash_seed",
    "prompt_embeds_digest",
    "block_extra_keys",
    "event_extra_keys",
    "BlockHasher",
    "hash_token_blocks",
]

# A block's hash, the prefix cache's key: the digest bytes of every algorithm but
# ``builtin``, whose hashes are Python ints. An alias, not a NewType: hashes flow from the
# hash function into the cache on the hot path with nothing to wrap them.
BlockHash: TypeAlias = bytes | int
HashFn = Callable[[Any], BlockHash]
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"


class MultiModalFeature(NamedTuple):
    """A multimodal item (image, audio...) occupying ``[offset, offset + length)`` of the prompt."""

    identifier: str
    offset: int
    length: int


class LoRA(NamedTuple):
    """A LoRA adapter as the block hash sees it (vLLM's ``LoRARequest`` fields)."""

    name: str
    id: int = 0
    path: str = ""


class HashedRequest(Protocol):
    """What block hashing reads from a request (``pagedkv.runtime.Request`` has it all)."""

    lora: LoRA | None
    mm_features: tuple[MultiModalFeature, ...]
    cache_salt: str | None
    prompt_embeds: Any
    num_prompt_tokens: int
    plain: bool
    block_hashes: list[BlockHash]
    all_token_ids: list[int]


def sha256(obj: Any) -> bytes:
    """SHA-256 of the pickle (highest protocol): vLLM's default ``sha256``."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of the canonical CBOR encoding: identical on every machine and language."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def xxhash(obj: Any) -> bytes:
    """xxh3-128 of the pickle: fast, not collision-resistant against attacks."""
    import xxhash as xx

    return xx.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    """xxh3-128 of the canonical CBOR encoding."""
    import xxhash as xx

    return xx.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


xxhash128 = xxhash_cbor  # pagedkv's earlier name


def builtin(obj: Any) -> int:
    """Python's ``hash`` (pagedkv only, for simulation): fastest, differs between processes."""
    return hash(obj)


HASH_FUNCTIONS: dict[str, HashFn] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
    "xxhash128": xxhash_cbor,  # pagedkv's earlier name for xxhash_cbor
    "builtin": builtin,
}
_NON_CRYPTO = {"xxhash", "xxhash_cbor", "xxhash128"}
_random_seed: str | None = None


def get_hash_fn(name: str) -> HashFn:
    """The hash function called ``name``; ConfigError listing the known names otherwise."""
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        known = ", ".join(sorted(HASH_FUNCTIONS))
        raise ConfigError(f"unknown hash_algo {name!r}; known: {known}") from None


def none_hash_seed(hash_algo: str) -> str:
    """vLLM's NONE_HASH seed: ``PYTHONHASHSEED``, else ``"vllm-none-hash"`` (xxhash: random)."""
    global _random_seed
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if hash_algo not in _NON_CRYPTO:
        return DEFAULT_NONE_HASH_SEED
    if _random_seed is None:
        _random_seed = os.urandom(32).hex()  # one per process, like vLLM's NONE_HASH
    return _random_seed


def _embeds_bytes(embeds: Any) -> bytes:
    torch = sys.modules.get("torch")  # a tensor means torch is imported already
    if torch is not None and isinstance(embeds, torch.Tensor):
        return bytes(embeds.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return bytes(memoryview(embeds))


def prompt_embeds_digest(embeds: Any, to_bytes: Callable[[Any], Any] | None = None) -> bytes:
    """The hash key of a block's prompt embeddings: SHA-256 of their bytes (``to_bytes``:
    how to read a tensor's bytes, default its raw memory)."""
    data = _embeds_bytes(embeds) if to_bytes is None else to_bytes(embeds)
    return hashlib.sha256(data).digest()


def block_extra_keys(
    request: HashedRequest,
    start: int,
    end: int,
    mm_index: int,
    embeds_digest: Callable[[Any], bytes] = prompt_embeds_digest,
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of the block ``[start, end)`` and the multimodal item index the next
    block starts looking at (past every item that ends inside this block; ``mm_index``
    unchanged when every item ends before it, as vLLM returns it).

    Args:
        request: the request whose LoRA, multimodal items, cache salt and prompt
            embeddings give the keys.
        start: the block's first token position.
        end: the token position the block ends before.
        mm_index: the first multimodal item (index into ``request.mm_features``) that
            may overlap the block: the previous block's returned index, 0 for the first.
        embeds_digest: the key bytes of a prompt-embedding slice.
    """
    keys, _, next_index = _extra_keys(request, start, end, mm_index, embeds_digest)
    return keys, next_index


def _extra_keys(
    request: HashedRequest,
    start: int,
    end: int,
    mm_index: int,
    embeds_digest: Callable[[Any], bytes] = prompt_embeds_digest,
) -> tuple[tuple[Any, ...] | None, int, int]:
    """``block_extra_keys`` plus the first item that does not end before ``start`` (where
    a block overlapping this one, as a lookahead window does, must start looking)."""
    keys: list[tuple[Any, ...]] = []
    lora = request.lora
    if lora is not None:
        keys.append(("lora", lora.name, lora.path))
    features = request.mm_features
    num_features = len(features)
    i = mm_index
    while i < num_features and features[i].offset + features[i].length <= start:
        i += 1  # items entirely before this block are never needed again
    live = i
    next_index = mm_index if i == num_features else i
    while i < num_features and features[i].offset < end:
        feature = features[i]
        keys.append(("mm", feature.identifier, feature.offset - start))
        if feature.offset + feature.length > end:
            break  # it continues into the next block
        i += 1
        next_index = i
    if start == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    if request.prompt_embeds is not None and start < request.num_prompt_tokens:
        keys.append(("prompt_embeds", embeds_digest(request.prompt_embeds[start:end])))
    return (tuple(keys) if keys else None), live, next_index


def event_extra_keys(
    request: HashedRequest, start: int, end: int, num_lookahead_tokens: int = 0
) -> tuple[Any, ...] | None:
    """The block's extra keys as KV events publish them (vLLM's untagged form): the LoRA
    name, ``(mm identifier, offset)`` pairs, the cache salt and prompt-embedding digests.
    With lookahead hashes they cover the block and its lookahead tokens, as the hash does;
    the lookahead tokens themselves go out in ``lookahead_token_ids``.

    Args:
        request: the request whose hash keys are published.
        start: the block's first token position.
        end: the token position the block ends before.
        num_lookahead_tokens: tokens past the block that its hash covers.
    """
    if request.plain:
        return None
    keys, _ = block_extra_keys(request, start, end + num_lookahead_tokens, 0)
    if keys is None:
        return None
    return tuple(key[1:] if key[0] == "mm" else key[1] for key in keys)


class BlockHasher:
    """Computes a request's new full-block hashes from the tokens it has so far.

    ``num_lookahead_tokens`` (L > 0, vLLM's lookahead block hashes for EAGLE): block
    ``i`` is hashed only once the L tokens after it exist, and its extra keys become
    ``(E, *those tokens)`` (``E`` the plain extra keys, over the block and those tokens).

    Args:
        block_size: tokens per hashed block.
        hash_algo: a name in ``HASH_FUNCTIONS``.
        seed: what the parent of the first block hashes from (vLLM's NONE_HASH seed);
            None: ``none_hash_seed(hash_algo)``.
        num_lookahead_tokens: tokens after each block its hash covers (0: none).
    """

    __slots__ = ("block_size", "hash_algo", "hash_fn", "none_hash", "num_lookahead_tokens")

    def __init__(
        self,
        block_size: int,
        hash_algo: str = "sha256",
        seed: str | None = None,
        num_lookahead_tokens: int = 0,
    ) -> None:
        if not isinstance(block_size, int) or block_size <= 0:
            raise ConfigError(f"hash block_size must be a positive integer, got {block_size!r}")
        if (
            not isinstance(num_lookahead_tokens, int)
            or isinstance(num_lookahead_tokens, bool)
            or num_lookahead_tokens < 0
        ):
            raise ConfigError(
                "BlockHasher.num_lookahead_tokens must be a non-negative integer, "
                f"got {num_lookahead_tokens!r}"
            )
        self.block_size = block_size
        self.hash_algo = hash_algo
        self.hash_fn = get_hash_fn(hash_algo)
        self.none_hash = self.hash_fn(none_hash_seed(hash_algo) if seed is None else seed)
        self.num_lookahead_tokens = num_lookahead_tokens

    def __call__(self, request: HashedRequest) -> list[BlockHash]:
        """Hashes of the full blocks after ``len(request.block_hashes)``."""
        hashes = request.block_hashes
        start = len(hashes) * self.block_size
        tokens = request.all_token_ids
        if start + self.block_size + self.num_lookahead_tokens > len(tokens):
            return []
        parent = hashes[-1] if hashes else self.none_hash
        if self.num_lookahead_tokens:
            return self._chain_lookahead(tokens, start, parent, request)
        return self._chain(tokens, start, parent, None if request.plain else request)

    def _chain(
        self, tokens: Sequence[int], start: int, parent: BlockHash, request: HashedRequest | None
    ) -> list[BlockHash]:
        fn, bs, end = self.hash_fn, self.block_size, len(tokens)
        extra = None
        mm_index = 0
        new: list[BlockHash] = []
        while start + bs <= end:
            if request is not None:
                extra, _, mm_index = _extra_keys(request, start, start + bs, mm_index)
            parent = fn((parent, tuple(tokens[start : start + bs]), extra))
            new.append(parent)
            start += bs
        return new

    def _chain_lookahead(
        self, tokens: Sequence[int], start: int, parent: BlockHash, request: HashedRequest
    ) -> list[BlockHash]:
        fn, bs, ahead = self.hash_fn, self.block_size, self.num_lookahead_tokens
        last = len(tokens) - ahead  # a block must end by here to be hashed
        plain = request.plain
        extra = None
        mm_index = 0
        new: list[BlockHash] = []
        while start + bs <= last:
            end = start + bs
            if not plain:  # the window overlaps the next block: resume at the live item
                extra, mm_index, _ = _extra_keys(request, start, end + ahead, mm_index)
            keys = (extra, tokens[end]) if ahead == 1 else (extra, *tokens[end : end + ahead])
            parent = fn((parent, tuple(tokens[start:end]), keys))
            new.append(parent)
            start = end
        return new


def hash_token_blocks(
    token_ids: Sequence[int], block_size: int, hash_algo: str = "sha256"
) -> list[BlockHash]:
    """Chained hashes of the full blocks of a plain token sequence (no extra keys)."""
    hasher = BlockHasher(block_size, hash_algo)
    return hasher._chain(token_ids, 0, hasher.none_hash, None)
