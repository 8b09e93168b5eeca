"""vLLM 0.33's module paths and names for its KV cache layer, over pagedkv.

Code written against vLLM's KV cache classes runs on pagedkv by importing
``pagedkv.compat.vllm.X`` where it imported ``vllm.X``. Every hit, allocation, plan, hash and
event comes from pagedkv's own runtime and planner; these modules translate names,
arguments and block objects only (docs/vllm-compat.md).
"""

from pagedkv.compat.vllm.sampling_params import SamplingParams

__all__ = ["SamplingParams", "__version__"]

__version__ = "0.33.0"
