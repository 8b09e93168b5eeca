"""vLLM's ``vllm.distributed.kv_transfer.kv_connector.factory``: connector names can be
registered (a module that registers its connector imports); creating one is vLLM's KV
connector machinery, outside the KV cache layer."""

from __future__ import annotations

from typing import Any, NoReturn

from pagedkv.compat.vllm._outside import OutsideKVCacheLayerError

__all__ = ["KVConnectorFactory"]


class KVConnectorFactory:
    """Connector name -> (module path, class name), as registered."""

    _registry: dict[str, tuple[str, str]] = {}

    @classmethod
    def register_connector(cls, name: str, module_path: str, class_name: str) -> None:
        if name in cls._registry:
            raise ValueError(f"Connector '{name}' is already registered.")
        cls._registry[name] = (module_path, class_name)

    @classmethod
    def create_connector(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise OutsideKVCacheLayerError(
            "KVConnectorFactory.create_connector builds vLLM's KV connectors, outside the "
            "KV cache layer that pagedkv.compat.vllm translates (docs/vllm-compat.md)"
        )
