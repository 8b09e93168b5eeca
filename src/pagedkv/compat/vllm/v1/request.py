"""vLLM's ``vllm.v1.request``: pagedkv's ``Request`` built with vLLM's arguments."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Sequence
from typing import Any

from pagedkv.runtime import request as _request
from pagedkv.runtime.hashing import BlockHasher, MultiModalFeature

__all__ = ["Request", "RequestStatus"]


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    WAITING_FOR_STREAMING_REQ = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()
    FINISHED_IGNORED = enum.auto()
    FINISHED_ERROR = enum.auto()
    FINISHED_REPETITION = enum.auto()

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def is_finished(status: RequestStatus) -> bool:
        return status > RequestStatus.PREEMPTED


def _feature(spec: Any) -> MultiModalFeature:
    position = spec.mm_position
    return MultiModalFeature(spec.identifier, position.offset, position.length)


_CORE_OPTIONS = frozenset(inspect.signature(_request.Request).parameters)


class Request(_request.Request):
    """pagedkv's request; ``block_hasher`` is the ``BlockHasher`` from
    ``kv_cache_utils.get_request_block_hasher``."""

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        sampling_params: Any = None,
        pooling_params: Any = None,
        client_index: int = 0,
        arrival_time: float | None = None,
        prompt_embeds: Any = None,
        prompt_is_token_ids: Any = None,
        mm_features: Sequence[Any] | None = None,
        lora_request: Any = None,
        cache_salt: str | None = None,
        priority: int = 0,
        trace_headers: Any = None,
        block_hasher: BlockHasher | None = None,
        resumable: bool = False,
        session_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        if block_hasher is not None and not isinstance(block_hasher, BlockHasher):
            raise TypeError("block_hasher must come from get_request_block_hasher")
        core_options = {
            name: value
            for name, value in (
                ("session_id", session_id),
                ("kv_cache_report_mode", kwargs.get("kv_cache_report_mode")),
            )
            if value is not None and name in _CORE_OPTIONS
        }
        tokens = list(prompt_token_ids or [])
        if prompt_embeds is not None and not tokens:
            tokens = [0] * len(prompt_embeds)
        super().__init__(
            request_id,
            tokens,
            lora=lora_request,
            cache_salt=cache_salt,
            mm_features=[_feature(f) for f in mm_features or ()],
            prompt_embeds=prompt_embeds,
            hasher=block_hasher,
            priority=priority,
            allow_empty_prompt=True,
            **core_options,
        )
        self.mm_feature_specs = list(mm_features or ())
        self.sampling_params = sampling_params
        self.pooling_params = pooling_params
        self._lora_request = lora_request
        self._prompt_embeds_per_block_hashes: dict[tuple[int, int], bytes] = {}
        self.client_index = client_index
        self.arrival_time = arrival_time
        if "session_id" not in _CORE_OPTIONS:
            self.session_id = session_id
        self.status = RequestStatus.WAITING
        self.spec_token_ids: list[int] = []
        self.num_output_placeholders = 0
        self.kv_transfer_params: Any = None
        self.skip_reading_prefix_cache = _skips_reading(sampling_params, pooling_params)
        self.max_tokens = getattr(sampling_params, "max_tokens", None)

    @property
    def lora_request(self) -> Any:
        return self._lora_request

    @lora_request.setter
    def lora_request(self, lora_request: Any) -> None:
        """Setting it changes the LoRA key of blocks hashed from now on (vLLM's)."""
        self._lora_request = lora_request
        self.set_lora(lora_request)

    @property
    def block_hasher(self) -> BlockHasher | None:
        return self.hasher

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)


def _skips_reading(sampling_params: Any, pooling_params: Any) -> bool:
    """vLLM's rule: the sampling (else pooling) params' ``skip_reading_prefix_cache``."""
    for params in (sampling_params, pooling_params):
        skip = getattr(params, "skip_reading_prefix_cache", None)
        if skip is not None:
            return bool(skip)
    return False
