"""EngineConfig: the one configuration object every layer takes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from pagedkv.dtypes import canonical_dtype_name
from pagedkv.errors import ConfigError, PagedKVError

__all__ = [
    "MambaCacheMode",
    "KV_CACHE_GROUPING_RULES",
    "PREFIX_CACHE_RETENTIONS",
    "GDN_PREFILL_KERNELS",
    "DEFAULT_GDN_PREFILL_KERNEL",
    "check_int",
    "check_fields",
    "check_choice",
    "ModelConfig",
    "CacheConfig",
    "ParallelConfig",
    "EAGLE_METHODS",
    "BLOCK_DROP_METHODS",
    "SchedulerConfig",
    "EngineConfig",
]

MambaCacheMode = Literal["none", "align"]

# The gated-DeltaNet prefill kernels vLLM 0.33 runs (its active ``gdn_prefill_backend``);
# only FlashInfer's emits states inside a prefill, so only it takes align-mode checkpoints.
GDN_PREFILL_KERNELS = ("flashinfer", "triton", "cutedsl", "aiter_flydsl", "sycl")
# vLLM's pick on the default GPU (Hopper): FlashInfer's.
DEFAULT_GDN_PREFILL_KERNEL = "flashinfer"

# KV cache grouping rules by name (CacheConfig.kv_cache_grouping_rule -> the qualname the
# planner resolves): vLLM 0.33's rule, the default, and pagedkv's opt-in search in the
# pagedkv.builders extension. A plugin adds a rule by adding an entry. See docs/planning.md.
KV_CACHE_GROUPING_RULES: dict[str, str] = {
    "vllm": "pagedkv.planning.grouping.vllm_grouping",
    "least-waste": "pagedkv.builders.least_waste.least_waste_grouping",
}

# Prefix-cache retentions by name (CacheConfig.prefix_cache_retention -> the qualname of the
# Retention class KVCacheManager imports): vLLM 0.33's, the default, and pagedkv's opt-in
# in the pagedkv.policies extension. A plugin adds one by adding an entry. See docs/runtime.md.
PREFIX_CACHE_RETENTIONS: dict[str, str] = {
    "vllm": "pagedkv.runtime.managers.base.Retention",
    "dense": "pagedkv.policies.retention.DenseRetention",
}


def check_int(
    owner: str,
    name: str,
    value: object,
    *,
    minimum: int = 1,
    allow_none: bool = False,
    error: type[PagedKVError] = ConfigError,
    alternative: str = "",
) -> None:
    """Raise ``error`` naming ``owner.name`` unless ``value`` is an int >= ``minimum``.

    Args:
        owner: class or function name the message names.
        name: field or argument name the message names.
        value: the value checked.
        minimum: the smallest value accepted.
        allow_none: accept None as well.
        error: the exception class raised.
        alternative: text appended to "must be ..." naming another accepted value (e.g.
            ``" or -1"``).
    """
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        want = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise error(f"{owner}.{name} must be {want}{alternative}, got {value!r}")


def check_fields(
    obj: object,
    *names: str,
    minimum: int = 1,
    allow_none: bool = False,
    error: type[PagedKVError] = ConfigError,
) -> None:
    """``error`` naming the class and field of the first bad integer field of ``obj``.

    Args:
        obj: the object whose fields are checked; its class name is the message's owner.
        minimum: the smallest value accepted.
        allow_none: accept None as well.
        error: the exception class raised.
    """
    for name in names:
        value = getattr(obj, name)
        check_int(
            type(obj).__name__, name, value, minimum=minimum, allow_none=allow_none, error=error
        )


def check_choice(
    obj: object,
    name: str,
    *choices: str,
    allow_none: bool = False,
    error: type[PagedKVError] = ConfigError,
) -> None:
    """``error`` naming the class and field unless ``obj.name`` is one of ``choices``.

    Args:
        obj: the object whose field is checked; its class name is the message's owner.
        name: the field checked.
        allow_none: accept None as well.
        error: the exception class raised.
    """
    value = getattr(obj, name)
    if not (value is None and allow_none) and value not in choices:
        known = " or ".join(map(repr, choices))
        raise error(f"{type(obj).__name__}.{name} must be {known}, got {value!r}")


def _check_bool(part: object, *names: str) -> None:
    for name in names:
        value = getattr(part, name)
        if not isinstance(value, bool):
            raise ConfigError(f"{type(part).__name__}.{name} must be True or False, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The model: its name, length limit and weight dtype.

    ``max_model_len == -1`` asks the planner for the largest length that fits.
    ``kv_cache_grouping`` is an object implementing ``SupportsKVCacheGrouping``;
    ``kv_cache_config_builder`` is a qualified builder class name the model declares.
    """

    name: str = "model"
    max_model_len: int = 8192
    dtype: str = "bfloat16"
    kv_cache_config_builder: str | None = None
    kv_cache_grouping: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if type(self.max_model_len) is not int or self.max_model_len != -1:
            check_int("ModelConfig", "max_model_len", self.max_model_len, alternative=" or -1")
        object.__setattr__(self, "dtype", canonical_dtype_name(self.dtype))
        builder = self.kv_cache_config_builder
        if builder is not None and (not isinstance(builder, str) or "." not in builder.strip()):
            raise ConfigError(
                "ModelConfig.kv_cache_config_builder must be a qualified class name like "
                f"'pkg.module.Builder', got {builder!r}"
            )


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """KV cache options."""

    block_size: int = 16
    cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    num_gpu_blocks_override: int | None = None
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    mamba_cache_mode: MambaCacheMode | None = None
    hash_algo: str = "sha256"  # vLLM 0.33's default prefix_caching_hash_algo
    # What stays cached: a name in PREFIX_CACHE_RETENTIONS ("vllm", the default, or "dense").
    prefix_cache_retention: str = "vllm"
    # vLLM's checkpoint spacing for sliding-window and Mamba groups (tokens): 0 keeps only
    # the blocks a replay or shared-prefix hit needs, a positive multiple of the scheduler
    # block size also one per interval, None every block (docs/runtime.md).
    prefix_cache_retention_interval: int | None = 0
    # vLLM's prefix match unit: hash every this many tokens, finer than the block size of a
    # hybrid model's groups (Mamba "align" groups then hit inside a block). None: the gcd.
    prefix_match_unit: int | None = None
    enable_hybrid_kv_cache: bool = True
    kv_cache_layout: str | None = None
    # How layers form KV cache groups: a name in KV_CACHE_GROUPING_RULES.
    kv_cache_grouping_rule: str = "vllm"
    # Most KV cache groups a searching rule ("least-waste") may choose (None: its default).
    max_kv_cache_groups: int | None = None
    # Eviction policy of the device pool by name ("lru": vLLM's; others: pagedkv.policies).
    eviction_policy: str = "lru"
    # The gated-DeltaNet prefill kernel (GDN_PREFILL_KERNELS): vLLM picks it from the GPU
    # (pagedkv.models.gdn_kernel); FlashInfer's is Hopper's, the default GPU's.
    gdn_prefill_kernel: str = DEFAULT_GDN_PREFILL_KERNEL

    def __post_init__(self) -> None:
        check_fields(self, "block_size")
        names = ("num_gpu_blocks_override", "kv_cache_memory_bytes", "max_kv_cache_groups")
        check_fields(self, *names, allow_none=True)
        check_fields(self, "prefix_match_unit", allow_none=True)
        check_fields(self, "prefix_cache_retention_interval", minimum=0, allow_none=True)
        _check_bool(self, "enable_prefix_caching", "enable_hybrid_kv_cache")
        if not isinstance(self.eviction_policy, str) or not self.eviction_policy:
            raise ConfigError(
                "CacheConfig.eviction_policy must be a policy name such as 'lru', "
                f"got {self.eviction_policy!r}"
            )
        util = self.gpu_memory_utilization
        if not isinstance(util, int | float) or isinstance(util, bool) or not 0 < util <= 1:
            raise ConfigError(
                "CacheConfig.gpu_memory_utilization must be in (0, 1], "
                f"got {self.gpu_memory_utilization!r}"
            )
        check_choice(self, "mamba_cache_mode", "none", "align", allow_none=True)
        check_choice(self, "prefix_cache_retention", *PREFIX_CACHE_RETENTIONS)
        check_choice(self, "kv_cache_grouping_rule", *KV_CACHE_GROUPING_RULES)
        check_choice(self, "gdn_prefill_kernel", *GDN_PREFILL_KERNELS)
        if self.kv_cache_grouping_rule == "vllm" and self.max_kv_cache_groups is not None:
            raise ConfigError(
                "CacheConfig.max_kv_cache_groups bounds a searched grouping; vLLM's grouping "
                "(kv_cache_grouping_rule='vllm', the default) has no group budget: set "
                "kv_cache_grouping_rule='least-waste' with it"
            )
        if self.cache_dtype != "auto":
            object.__setattr__(self, "cache_dtype", canonical_dtype_name(self.cache_dtype))

    @property
    def resolved_mamba_cache_mode(self) -> MambaCacheMode:
        """Align (checkpoint per block) with prefix caching on, else none."""
        if self.mamba_cache_mode is not None:
            return self.mamba_cache_mode
        return "align" if self.enable_prefix_caching else "none"


@dataclass(frozen=True, kw_only=True)
class ParallelConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_fields(self, "tensor_parallel_size", "pipeline_parallel_size")


# vLLM's speculative methods whose drafter reads the target's hidden states (EAGLE family).
EAGLE_METHODS = ("eagle", "eagle3", "mtp", "dflash", "dspark")
# Those whose draft KV at a position depends on the next token (the trailing block dropped).
BLOCK_DROP_METHODS = ("eagle", "eagle3", "mtp")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The batch limits and speculative decoding as vLLM's ``--speculative-config`` states
    it: ``speculative_method`` (None: none), ``num_speculative_tokens``,
    ``num_draft_modules`` (an MTP draft's modules, its ``num_nextn_predict_layers``) and
    ``disable_eagle_block_drop``."""

    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_num_encoder_input_tokens: int | None = None
    async_scheduling: bool = False
    num_lookahead_tokens: int = 0
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    num_draft_modules: int = 1
    disable_eagle_block_drop: bool = False

    def __post_init__(self) -> None:
        check_fields(self, "max_num_batched_tokens", "max_num_seqs", "num_draft_modules")
        check_fields(self, "max_num_encoder_input_tokens", allow_none=True)
        check_fields(self, "num_lookahead_tokens", "num_speculative_tokens", minimum=0)
        _check_bool(self, "async_scheduling")
        _check_bool(self, "disable_eagle_block_drop")
        method = self.speculative_method
        if method is not None and (not isinstance(method, str) or not method):
            raise ConfigError(
                f"SchedulerConfig.speculative_method must be a method name or None, got {method!r}"
            )

    @property
    def num_prefill_lookahead_tokens(self) -> int:
        """Prompt tokens past the computed range the drafter reads (vLLM 0.33): none
        without an EAGLE-family drafter, ``num_speculative_tokens`` for a chain of MTP
        modules (each reads one token further), else 1."""
        if self.speculative_method not in EAGLE_METHODS:
            return 0
        modules = min(self.num_draft_modules, self.num_speculative_tokens)
        if self.speculative_method == "mtp" and modules > 1:
            return self.num_speculative_tokens
        return 1

    @property
    def use_eagle_block_drop(self) -> bool:
        """Whether the groups holding draft layers drop their trailing prefix-cache block
        (vLLM's EAGLE groups)."""
        return self.speculative_method in BLOCK_DROP_METHODS and not self.disable_eagle_block_drop


_PARTS = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "parallel": ParallelConfig,
    "scheduler": SchedulerConfig,
}


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Model, cache, parallel and scheduler parts; pagedkv's stand-in for VllmConfig."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        for name in _PARTS:
            _check_part(name, getattr(self, name))

    @classmethod
    def create(cls, **options: Any) -> EngineConfig:
        """Build from flat field names, e.g. ``create(block_size=32, tensor_parallel_size=2)``."""
        return cls().replace(**options)

    def replace(self, **options: Any) -> EngineConfig:
        """A copy with flat field names changed (each name belongs to one part).

        A whole part can be given too: ``replace(model=ModelConfig(...))``; flat
        names given with it apply on top of it.
        """
        parts = {name: options.get(name, getattr(self, name)) for name in _PARTS}
        changes: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
        for key, value in options.items():
            if key in _PARTS:
                _check_part(key, value)
            elif key in _FIELD_TO_PART:
                changes[_FIELD_TO_PART[key]][key] = value
            else:
                known = ", ".join([*_PARTS, *sorted(_FIELD_TO_PART)])
                raise ConfigError(f"unknown EngineConfig option {key!r}; known: {known}")
        new = {
            n: dataclasses.replace(p, **changes[n]) if changes[n] else p for n, p in parts.items()
        }
        return EngineConfig(**new)

    @property
    def max_model_len(self) -> int:
        return self.model.max_model_len

    @property
    def block_size(self) -> int:
        return self.cache.block_size

    @property
    def kv_cache_dtype(self) -> str:
        """The cache dtype with ``auto`` resolved to the model dtype."""
        return self.model.dtype if self.cache.cache_dtype == "auto" else self.cache.cache_dtype

    @property
    def max_concurrent_batches(self) -> int:
        pp = self.parallel.pipeline_parallel_size
        return 2 if (self.scheduler.async_scheduling and pp == 1) else pp

    @property
    def max_in_flight_tokens(self) -> int:
        """Tokens that may be scheduled but not yet computed: bounds local-attention admission."""
        return self.max_concurrent_batches * self.scheduler.max_num_batched_tokens

    @property
    def max_num_encoder_input_tokens(self) -> int:
        value = self.scheduler.max_num_encoder_input_tokens
        return self.scheduler.max_num_batched_tokens if value is None else value


def _check_part(name: str, value: object) -> None:
    if not isinstance(value, _PARTS[name]):
        raise ConfigError(f"EngineConfig.{name} must be a {_PARTS[name].__name__}, got {value!r}")


_FIELD_TO_PART: dict[str, str] = {
    f.name: part for part, klass in _PARTS.items() for f in dataclasses.fields(klass)
}
