"""vLLM's ``vllm.lora.request``: the LoRA adapter a request names (its hash keys)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoRARequest"]


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int
    lora_path: str = ""

    @property
    def adapter_id(self) -> int:
        return self.lora_int_id

    @property
    def name(self) -> str:
        return self.lora_name

    @property
    def path(self) -> str:
        return self.lora_path
