"""vLLM's ``vllm.v1.core.kv_cache_utils`` over pagedkv: block objects, hash keys, the
request block hasher (pagedkv's ``BlockHasher``) and the capacity helpers."""

from __future__ import annotations

import copy
import dataclasses
import operator
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple, NewType

from pagedkv.compat.vllm.config._engine_config import as_engine_config
from pagedkv.compat.vllm.v1.core._dcp import dcp_kv_cache_config
from pagedkv.runtime import hashing as _hashing
from pagedkv.runtime.block_sizes import resolve_block_sizes
from pagedkv.runtime.hashing import DEFAULT_NONE_HASH_SEED, BlockHasher

__all__ = [
    "NONE_HASH",
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheBlockCopy",
    "algo_name",
    "generate_block_hash_extra_keys",
    "generate_scheduler_kv_cache_config",
    "get_block_hash",
    "get_group_id",
    "get_kv_cache_capacity",
    "get_max_concurrency_for_kv_cache_config",
    "get_none_hash_seed",
    "get_request_block_hasher",
    "hash_block_tokens",
    "init_none_hash",
    "make_block_hash_with_group_id",
    "null_head_len",
    "resolve_cache_hit_alignment_tokens",
    "resolve_block_hashes",
    "resolve_dcp_kv_block_size",
    "resolve_dcp_kv_cache_spec",
    "to_event_extra_keys",
    "trim_null_head",
]

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
ExternalBlockHash = bytes | int

NONE_HASH: Any = None
_none_hash_seed: str | None = None


def make_block_hash_with_group_id(block_hash: Any, group_id: int) -> BlockHashWithGroupId:
    """vLLM's cache key: the hash bytes then the group id in 4 big-endian bytes."""
    return BlockHashWithGroupId(block_hash + group_id.to_bytes(4, "big", signed=False))


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    return BlockHash(key[:-4])


def get_group_id(key: BlockHashWithGroupId) -> int:
    return int.from_bytes(key[-4:], "big", signed=False)


def algo_name(hash_fn: Callable[[Any], Any]) -> str:
    """pagedkv's name for one of its hash functions (vLLM passes the function)."""
    if hash_fn is hash:
        return "builtin"
    for name, fn in _hashing.HASH_FUNCTIONS.items():
        if fn is hash_fn:
            return name
    known = ", ".join(sorted(_hashing.HASH_FUNCTIONS))
    raise ValueError(f"hash function {hash_fn!r} is not one of pagedkv's ({known})")


def init_none_hash(hash_fn: Callable[[Any], Any]) -> None:
    """Set ``NONE_HASH``, the parent of every first block, for ``hash_fn`` (pagedkv's seed
    rule: ``PYTHONHASHSEED``, else the fixed seed, a per-process one for xxhash)."""
    global NONE_HASH, _none_hash_seed
    seed = resolve_none_hash_seed(hash_fn)
    _none_hash_seed = seed
    NONE_HASH = hash_fn(seed)


def resolve_none_hash_seed(hash_fn: Callable[[Any], Any]) -> str:
    """The seed ``NONE_HASH`` derives from: ``PYTHONHASHSEED``, else pagedkv's seed for the
    algorithm (fixed for cryptographic ones, random per call for xxhash)."""
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if algo_name(hash_fn) in ("xxhash", "xxhash_cbor", "xxhash128"):
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def get_none_hash_seed() -> str:
    return DEFAULT_NONE_HASH_SEED if _none_hash_seed is None else _none_hash_seed


def hash_block_tokens(
    hash_function: Callable[[Any], Any],
    parent_block_hash: Any,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> Any:
    """One chained block hash, as pagedkv's ``BlockHasher`` computes it."""
    parent = parent_block_hash or NONE_HASH
    return hash_function((parent, tuple(curr_block_token_ids), extra_keys))


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra hash keys of one block (pagedkv's ``block_extra_keys``); a request's
    prompt-embedding keys are computed once per block range and kept on the request."""
    cache: dict[tuple[int, int], bytes] | None = getattr(
        request, "_prompt_embeds_per_block_hashes", None
    )

    def embeds_digest(embeds: Any) -> bytes:
        span = (start_token_idx, end_token_idx)
        digest = None if cache is None else cache.get(span)
        if digest is None:
            # through this module's tensor_data, looked up per call as vLLM's is
            digest = _hashing.prompt_embeds_digest(embeds, lambda t: tensor_data(t))
            if cache is not None:
                cache[span] = digest
        return digest

    return _hashing.block_extra_keys(
        request, start_token_idx, end_token_idx, start_mm_idx, embeds_digest
    )


def to_event_extra_keys(
    extra_keys: Iterable[tuple[Any, ...] | None] | None,
) -> list[tuple[Any, ...] | None] | None:
    """Block extra keys in the untagged form KV events publish."""
    if not extra_keys:
        return None
    out = [
        None if keys is None else tuple(k[1:] if k[0] == "mm" else k[1] for k in keys)
        for keys in extra_keys
    ]
    return out or None


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], Any],
    num_hash_lookahead_tokens: int = 0,
) -> BlockHasher:
    """pagedkv's ``BlockHasher``: called with a request, it returns its new block hashes.
    ``num_hash_lookahead_tokens`` may be any integer, a bool included (vLLM's arithmetic
    reads ``True`` as 1)."""
    lookahead = operator.index(num_hash_lookahead_tokens)
    return BlockHasher(
        hash_block_size,
        algo_name(caching_hash_fn),
        seed=_none_hash_seed,
        num_lookahead_tokens=int(lookahead),
    )


class KVCacheBlock:
    """One block: a live view of a pagedkv pool's block (``pool`` set), or a standalone
    record (``pool`` None) as vLLM's tests build them."""

    __slots__ = ("_block_hash", "_free_queue", "_pool", "_ref_cnt", "block_id", "is_null", "pool")

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        *,
        pool: Any = None,
        _block_hash: Any = None,
        is_null: bool = False,
    ) -> None:
        self.block_id = block_id
        self.pool = pool
        self._pool = None if pool is None else pool.impl
        self._ref_cnt = ref_cnt
        self._block_hash = _block_hash
        self.is_null = is_null
        self._free_queue: Any = None  # the FreeKVCacheBlockQueue holding it, if any

    @property
    def prev_free_block(self) -> Any:
        """The block (or list end) before this one in its ``FreeKVCacheBlockQueue``, or in
        its pool's free queue (None if not free)."""
        queue = self._free_queue
        if queue is not None:
            return queue.neighbour(self, after=False)
        return (
            None if self.pool is None else self.pool.free_block_queue.neighbours(self.block_id)[0]
        )

    @property
    def next_free_block(self) -> Any:
        """The block (or list end) after this one in its ``FreeKVCacheBlockQueue``, or in
        its pool's free queue (None if not free)."""
        queue = self._free_queue
        if queue is not None:
            return queue.neighbour(self, after=True)
        return (
            None if self.pool is None else self.pool.free_block_queue.neighbours(self.block_id)[1]
        )

    @property
    def ref_cnt(self) -> int:
        return self._ref_cnt if self._pool is None else self._pool.ref_cnt[self.block_id]

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        if self._pool is None:
            self._ref_cnt = value
        else:
            self._pool.ref_cnt[self.block_id] = value

    @property
    def block_hash(self) -> BlockHashWithGroupId | None:
        if self._pool is None or self.is_null:
            return self._block_hash
        key = self._pool.key_of(self.block_id)
        return None if key is None else make_block_hash_with_group_id(*key)

    @property
    def block_hash_num_tokens(self) -> int | None:
        """Tokens the block's primary key covers (None: no key, or a whole-block key of a
        block no request holds)."""
        if self._pool is None or self._pool.block_hash[self.block_id] is None:
            return None
        tokens = self._pool.sub_block_key_tokens(self.block_id)
        if tokens is None and self.pool is not None:
            tokens = self.pool.full_key_tokens(self.block_id)
        return tokens

    def set_block_hash(
        self, block_hash: BlockHashWithGroupId, num_tokens: int | None = None
    ) -> None:
        """The block's key, not yet in any map (``BlockHashToBlockMap.insert`` maps it).
        A pool block takes it in pagedkv's pool; the null block, which pagedkv never
        keys, and a standalone block carry it themselves."""
        if self.block_hash is not None:
            raise AssertionError("The block already has a hash. This should not happen.")
        if self._pool is None or self.is_null:
            self._block_hash = block_hash
            return
        group_id = get_group_id(block_hash)
        self._pool.hash_map(group_id)  # the group's maps exist for a later eviction
        self._pool.block_hash[self.block_id] = get_block_hash(block_hash)
        self._pool.block_group[self.block_id] = group_id

    def reset_hash(self) -> None:
        if self._pool is not None and not self.is_null:
            raise ValueError("a pool's block loses its hash through its pool (evict_blocks)")
        self._block_hash = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlock):
            return NotImplemented
        if self._pool is not None or other._pool is not None:
            return self is other
        return (self.block_id, self._ref_cnt, self._block_hash) == (
            other.block_id,
            other._ref_cnt,
            other._block_hash,
        )

    def __hash__(self) -> int:
        return id(self)

    def __repr__(self) -> str:
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self.block_hash!r})"
        )


def null_head_len(blocks: Sequence[KVCacheBlock]) -> int:
    """Leading null blocks (a sliding window's or Mamba's skipped prefix)."""
    for i, block in enumerate(blocks):
        if not block.is_null:
            return i
    return len(blocks)


def trim_null_head(blocks: Sequence[KVCacheBlock]) -> Sequence[KVCacheBlock]:
    n = null_head_len(blocks)
    return blocks[n:] if n else blocks


class KVCacheBlockCopy(NamedTuple):
    """A copy-on-write the worker performs: ``src_block_id``'s content into ``dst_block_id``."""

    src_block_id: int
    dst_block_id: int


class BlockHashListWithBlockSize:
    """Hashes computed every ``hash_block_size`` tokens, read at ``target_block_size``."""

    def __init__(self, block_hashes: list[Any], hash_block_size: int, target_block_size: int):
        if target_block_size % hash_block_size:
            raise AssertionError("target_block_size must be a multiple of hash_block_size")
        self.block_hashes = block_hashes
        self.hash_block_size = hash_block_size
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if idx < 0:
            idx += len(self)
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]

    def __iter__(self) -> Iterator[Any]:
        return (self[i] for i in range(len(self)))


def tensor_data(tensor: Any) -> memoryview:
    """A tensor's bytes (what prompt-embedding hash keys hash)."""
    return memoryview(_hashing._embeds_bytes(tensor))


from pagedkv.compat.vllm.v1.core.free_block_queue import FreeKVCacheBlockQueue  # noqa: E402

_PENDING = "a vLLM KV cache helper pagedkv.compat.vllm does not translate yet"


def _layer_specs(spec: Any) -> list[Any]:
    return list(spec.kv_cache_specs.values()) if hasattr(spec, "kv_cache_specs") else [spec]


def resolve_dcp_kv_block_size(spec: Any, dcp_world_size: int) -> int:
    """Tokens one block spans under decode context parallelism: a DCP-sharded spec's
    block holds ``block_size`` tokens on each of the ``dcp_world_size`` ranks."""
    return int(spec.block_size) * (dcp_world_size if getattr(spec, "dcp_sharded", False) else 1)


def resolve_dcp_kv_cache_spec(spec: Any, dcp_world_size: int) -> Any:
    """``spec`` with its block size scaled for DCP (itself when it is not sharded; a
    uniform-type group scales every layer)."""
    block_size = resolve_dcp_kv_block_size(spec, dcp_world_size)
    if block_size == spec.block_size:
        return spec
    if hasattr(spec, "kv_cache_specs"):
        layers = {
            name: resolve_dcp_kv_cache_spec(layer, dcp_world_size)
            for name, layer in spec.kv_cache_specs.items()
        }
        return dataclasses.replace(spec, block_size=block_size, kv_cache_specs=layers)
    return dataclasses.replace(spec, block_size=block_size)


def resolve_block_hashes(
    block_hashes: Any,
    hash_block_size: int,
    block_size: int,
    *,
    supports_fine_grained_hash_lookup: bool = False,
    alignment_tokens: int | None = None,
) -> Any:
    """The hashes a hit search at ``block_size`` reads: the raw ones when the sizes match
    or a fine-grained search may end inside a block (``alignment_tokens`` finer than the
    block), else a block-size view of them (a view must already be at ``block_size``)."""
    if block_size == hash_block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        if block_hashes.scale_factor != block_size // hash_block_size:
            raise AssertionError(
                f"a hash view at {block_hashes.scale_factor * hash_block_size} tokens per "
                f"block read at block_size={block_size}"
            )
        return block_hashes
    if (
        supports_fine_grained_hash_lookup
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    if block_size % hash_block_size:
        raise AssertionError(f"block_size={block_size} is not a multiple of {hash_block_size}")
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)


def generate_scheduler_kv_cache_config(kv_cache_configs: Sequence[Any]) -> Any:
    """The scheduler's config: the workers' (equal but for layer names), each uniform-type
    group standing as its first layer's spec."""
    first = kv_cache_configs[0]
    for cfg in kv_cache_configs:
        if cfg.num_blocks != first.num_blocks:
            raise AssertionError(
                f"workers differ in num_blocks: {cfg.num_blocks}, {first.num_blocks}"
            )
        host = getattr(cfg, "hisparse_host_num_blocks", None)
        if host != getattr(first, "hisparse_host_num_blocks", None):
            raise AssertionError("workers differ in hisparse_host_num_blocks")
    cfg = copy.deepcopy(first)
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        if hasattr(spec, "kv_cache_specs") and spec.kv_cache_specs:
            object.__setattr__(group, "kv_cache_spec", next(iter(spec.kv_cache_specs.values())))
    return cfg


def get_max_concurrency_for_kv_cache_config(vllm_config: Any, kv_cache_config: Any) -> float:
    """Requests of ``max_model_len`` the pool holds at once: each group's table costs
    whole blocks (the spec's ``max_memory_usage_blocks``), summed over the device groups;
    host-resident groups draw on the host pool, and the smaller limit applies."""
    config = as_engine_config(vllm_config)
    device_blocks = host_blocks = 0
    for group in kv_cache_config.kv_cache_groups:
        blocks = group.kv_cache_spec.max_memory_usage_blocks(config)
        if getattr(group, "host_resident", False):
            host_blocks += blocks
        else:
            device_blocks += blocks
    limits = [kv_cache_config.num_blocks / device_blocks]
    if host_blocks:
        host_pool = getattr(kv_cache_config, "hisparse_host_num_blocks", None)
        if host_pool is None:
            raise AssertionError("host-resident groups need hisparse_host_num_blocks")
        limits.append(host_pool / host_blocks)
    return min(limits)


def get_kv_cache_capacity(vllm_config: Any, kv_cache_config: Any) -> tuple[int, float]:
    """Tokens the cache holds at the maximum concurrency, and that concurrency."""
    concurrency = get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config)
    max_model_len = as_engine_config(vllm_config).max_model_len
    return int(concurrency * max_model_len), concurrency


def resolve_cache_hit_alignment_tokens(
    kv_cache_config: Any, vllm_config: Any, scheduler_block_size: int, hash_block_size: int
) -> int:
    """Tokens prefix-cache hits land on, as pagedkv's manager resolves them for this config
    (``pagedkv.runtime.block_sizes``): the hash block when hits may end inside a block."""
    groups = kv_cache_config.kv_cache_groups
    if not vllm_config.cache_config.enable_prefix_caching or len(groups) <= 1:
        return scheduler_block_size
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    runtime_groups = dcp_kv_cache_config(kv_cache_config, dcp).kv_cache_groups
    sizes = resolve_block_sizes(runtime_groups, True, hash_block_size, dcp)
    return hash_block_size if sizes.partial_hash_hits else scheduler_block_size


def maybe_convert_block_hash(hash_bytes: Any) -> ExternalBlockHash:
    """A block hash as KV events publish it (an int only with
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``): pagedkv's ``external_block_hash``."""
    from pagedkv.compat.vllm import envs
    from pagedkv.events.wire import external_block_hash

    return external_block_hash(hash_bytes, envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)


def resolve_kv_cache_block_sizes(kv_cache_config: Any, vllm_config: Any) -> tuple[int, int]:
    """(scheduler block size, hash block size) for a planned config (pagedkv's
    ``resolve_block_sizes`` over the groups, block sizes scaled by DCP)."""
    import dataclasses

    from pagedkv.errors import ConfigError
    from pagedkv.runtime.block_sizes import resolve_block_sizes

    cache = vllm_config.cache_config
    dcp = vllm_config.parallel_config.decode_context_parallel_size
    groups = list(kv_cache_config.kv_cache_groups)
    hashing = bool(cache.enable_prefix_caching) or vllm_config.kv_transfer_config is not None
    if len(groups) <= 1:
        if groups and not getattr(groups[0].kv_cache_spec, "dcp_sharded", False):
            dcp = 1
        block_size = int(cache.block_size * dcp)
        unit = cache.prefix_match_unit
        if groups and hashing and unit not in (None, block_size):
            raise ValueError(
                f"Invalid prefix_match_unit={unit}; with a single KV cache group, "
                f"prefix-cache hits land on the block size ({block_size}). Unset it or set it "
                f"to {block_size}."
            )
        return block_size, block_size
    scaled = [
        dataclasses.replace(g, kv_cache_spec=resolve_dcp_kv_cache_spec(g.kv_cache_spec, dcp))
        for g in groups
    ]
    try:
        sizes = resolve_block_sizes(scaled, hashing, cache.prefix_match_unit)
    except ConfigError as exc:
        raise ValueError(f"Invalid prefix_match_unit: {exc}") from exc
    return sizes.scheduler_block_size, sizes.hash_block_size
