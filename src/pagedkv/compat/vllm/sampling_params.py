"""vLLM's ``vllm.sampling_params``: the fields a KV cache test reads, nothing sampled."""

from __future__ import annotations

from typing import Any

__all__ = ["RequestOutputKind", "SamplingParams"]


class RequestOutputKind:
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    """Generation limits a request carries (the KV cache reads ``max_tokens`` at most)."""

    def __init__(
        self,
        max_tokens: int | None = 16,
        prompt_logprobs: int | None = None,
        **fields: Any,
    ) -> None:
        self.max_tokens = max_tokens
        self.prompt_logprobs = prompt_logprobs
        self.stop_token_ids: list[int] = list(fields.pop("stop_token_ids", None) or [])
        self.ignore_eos = bool(fields.pop("ignore_eos", False))
        self.n = int(fields.pop("n", 1))
        self.structured_outputs = fields.pop("structured_outputs", None)
        self.extra_args = fields.pop("extra_args", None)
        skip = fields.pop("skip_reading_prefix_cache", None)
        if skip is None:  # vLLM: prompt logprobs need every prompt token computed
            skip = prompt_logprobs is not None or fields.get("prompt_logprob_token_ids") is not None
        self.skip_reading_prefix_cache: bool = skip
        for name, value in fields.items():
            setattr(self, name, value)
        self.eos_token_id: int | None = None

    def update_from_generation_config(
        self, generation_config: dict[str, Any], eos_token_id: int | None = None
    ) -> None:
        self.eos_token_id = eos_token_id

    def clone(self) -> SamplingParams:
        copy = SamplingParams.__new__(SamplingParams)
        copy.__dict__.update(self.__dict__)
        return copy
