"""vLLM 0.33's own hybrid block-size alignment and planner on a gated-DeltaNet hybrid
(Qwen3-Next / Qwen3.5 config.json).

Run with vLLM's environment and the shared peer tools on the path (not part of the test
suite; its output is recorded in tests/planning/test_vllm_hybrid_plan.py):

    PYTHONPATH=../shared/tools/vllm_peer /tmp/vllm-peer-venv/bin/python \\
        tests/planning/peer/vllm_plan_hybrid.py src/pagedkv/data/models/Qwen3.5-27B/config.json \\
        --max-model-len 32768 --kv-bytes 8589934592

What runs is vLLM's code: the architecture's ``verify_and_update_config`` and
``HybridAttentionMambaModelConfig.verify_and_update_config``,
``Platform._align_hybrid_block_size`` (with FlashAttention as the attention backend, as
on a Hopper GPU), ``MambaBase.get_kv_cache_spec``, ``get_mamba_prefill_checkpoint_grid``
and the planner. Three things a GPU worker would supply are stood in for, because the
model classes cannot be imported on this CPU-only install:

- the model class's state-shape and state-dtype hooks (each one call of vLLM's
  ``MambaStateShapeCalculator.gated_delta_net_state_shape`` /
  ``MambaStateDtypeCalculator.gated_delta_net_state_dtype`` with the config's numbers);
- the gated-DeltaNet layers: a ``MambaBase`` that reports the FlashInfer prefill's
  checkpoint alignment (``FLASHINFER_GDN_CHECKPOINT_ALIGNMENT``: the GDN prefill backend
  vLLM picks on Hopper) and, like the real layer, one prefill checkpoint block on the
  prefix-cache grid;
- the list of attention backends (FlashAttention).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import peer_common as pc
import torch


def _read(path: str) -> tuple[str, dict]:
    """The config's architecture and its language-model fields."""
    with open(path) as f:
        config = json.load(f)
    return config["architectures"][0], config.get("text_config", config)


def _placeholder_dir(text: dict) -> str:
    """A Llama-shaped HF config whose attention heads are the model's, carrying the
    linear-attention fields the state-shape hook reads."""
    keys = (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    )
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": text["num_attention_heads"] * text["head_dim"],
        "intermediate_size": 512,
        "num_attention_heads": text["num_attention_heads"],
        "num_key_value_heads": text["num_key_value_heads"],
        "head_dim": text["head_dim"],
        "num_hidden_layers": 2,
        "vocab_size": 32000,
        "max_position_embeddings": 1048576,
        "torch_dtype": "bfloat16",
        **{k: text[k] for k in keys},
    }
    if "mamba_ssm_dtype" in text:
        config["mamba_ssm_dtype"] = text["mamba_ssm_dtype"]
    folder = tempfile.mkdtemp(prefix="vllm-peer-hybrid-")
    Path(folder, "config.json").write_text(json.dumps(config))
    return folder


def _layer_types(text: dict) -> list[str]:
    if "layer_types" in text:
        return list(text["layer_types"])
    interval = text["full_attention_interval"]
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(text["num_hidden_layers"])
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=32768)
    ap.add_argument("--kv-bytes", type=int, required=True)
    ap.add_argument("--no-prefix-caching", action="store_true")
    args = ap.parse_args()
    architecture, text = _read(args.config)

    from vllm.config.vllm import set_current_vllm_config
    from vllm.model_executor.layers.mamba import abstract as mamba_abstract
    from vllm.model_executor.layers.mamba.mamba_utils import (
        MambaStateDtypeCalculator,
        MambaStateShapeCalculator,
    )
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import (
        MODELS_CONFIG_MAP,
        HybridAttentionMambaModelConfig,
    )
    from vllm.platforms.interface import Platform
    from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
    from vllm.v1.attention.backends.gdn_attn import FLASHINFER_GDN_CHECKPOINT_ALIGNMENT
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    pc.GENERIC_MODEL_DIR = Path(_placeholder_dir(text))
    placeholder = {
        "name": "placeholder",
        "max_model_len": args.max_model_len,
        "layers": [{"name": "x", "type": "full", "num_kv_heads": 1, "head_size": 64,
                    "dtype": "bfloat16"}],
    }  # fmt: skip
    vllm_config, _, _ = pc.build(
        placeholder,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        enable_prefix_caching=not args.no_prefix_caching,
        hybrid_align="none",
    )
    cache = vllm_config.cache_config
    cache.mamba_block_size = None  # as before verify_and_update_config
    # VllmConfig runs the architecture's hook (Qwen3.5: the ssm cache dtype from the
    # config's mamba_ssm_dtype), then the hybrid one.
    if architecture in MODELS_CONFIG_MAP:
        MODELS_CONFIG_MAP[architecture].verify_and_update_config(vllm_config)
    HybridAttentionMambaModelConfig.verify_and_update_config(vllm_config)

    class StateHooks:
        @classmethod
        def get_mamba_state_shape_from_config(cls, config):  # type: ignore[no-untyped-def]
            hf = config.model_config.hf_text_config
            return MambaStateShapeCalculator.gated_delta_net_state_shape(
                config.parallel_config.tensor_parallel_size,
                hf.linear_num_key_heads,
                hf.linear_num_value_heads,
                hf.linear_key_head_dim,
                hf.linear_value_head_dim,
                hf.linear_conv_kernel_dim,
                0,
            )

        @classmethod
        def get_mamba_state_dtype_from_config(cls, config):  # type: ignore[no-untyped-def]
            return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
                config.model_config.dtype,
                config.cache_config.mamba_cache_dtype,
                config.cache_config.mamba_ssm_cache_dtype,
            )

    class GDNLayer(mamba_abstract.MambaBase):
        def get_state_shape(self):  # type: ignore[no-untyped-def]
            return StateHooks.get_mamba_state_shape_from_config(vllm_config)

        def get_state_dtype(self):  # type: ignore[no-untyped-def]
            return StateHooks.get_mamba_state_dtype_from_config(vllm_config)

        @property
        def mamba_type(self):  # type: ignore[no-untyped-def]
            return MambaAttentionBackendEnum.GDN_ATTN

        def get_prefill_checkpoint_alignment(self):  # type: ignore[no-untyped-def]
            return (
                FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if cache.mamba_cache_mode == "align" else None
            )

    types = _layer_types(text)
    layers = {}
    forward_context = vllm_config.compilation_config.static_forward_context
    for i, kind in enumerate(types):
        if kind == "linear_attention":
            name = f"model.layers.{i}.linear_attn"
            forward_context[name] = layers[name] = GDNLayer()

    ModelRegistry.resolve_model_cls = lambda *a, **k: (StateHooks, "stand-in")  # type: ignore[method-assign]
    Platform._find_non_ssm_backends = classmethod(lambda cls, c: [FlashAttentionBackend])  # type: ignore[method-assign,assignment]
    with set_current_vllm_config(vllm_config):
        Platform._align_hybrid_block_size(vllm_config, FlashAttentionBackend)

    specs = {}
    kv_heads = text["num_key_value_heads"] // vllm_config.parallel_config.tensor_parallel_size
    for i, kind in enumerate(types):
        if kind == "full_attention":
            specs[f"model.layers.{i}.self_attn"] = FullAttentionSpec(
                block_size=cache.block_size,
                num_kv_heads=kv_heads,
                head_size=text["head_dim"],
                dtype=torch.bfloat16,
            )
            continue
        name = f"model.layers.{i}.linear_attn"
        spec = layers[name].get_kv_cache_spec(vllm_config)
        if layers[name].get_prefill_checkpoint_alignment() is not None:
            grid = mamba_abstract.get_mamba_prefill_checkpoint_grid(vllm_config)
            spec = MambaSpec(
                **{**spec.__dict__, "num_prefill_checkpoint_blocks": 1,
                   "prefill_checkpoint_alignment": grid}
            )  # fmt: skip
        specs[name] = spec

    worker, sched, sched_bs, hash_bs = pc.plan(vllm_config, specs, args.kv_bytes)
    groups = []
    for g in worker.kv_cache_groups:
        spec = g.kv_cache_spec
        per_layer = getattr(spec, "kv_cache_specs", None) or dict.fromkeys(g.layer_names, spec)
        first = next(iter(per_layer.values()))
        groups.append(
            [
                type(first).__name__,
                list(g.layer_names),
                first.block_size,
                first.page_size_bytes,
                getattr(first, "num_prefill_checkpoint_blocks", None),
                getattr(first, "prefill_checkpoint_alignment", None),
            ]
        )
    sizes = {t.size for t in worker.kv_cache_tensors}
    print(
        json.dumps(
            {
                "block_size": cache.block_size,
                "mamba_block_size": cache.mamba_block_size,
                "mamba_page_size_padded": cache.mamba_page_size_padded,
                "num_blocks": worker.num_blocks,
                "bytes_per_block": sizes.pop() // worker.num_blocks,
                "scheduler_block_size": sched_bs,
                "hash_block_size": hash_bs,
                "max_concurrency": get_max_concurrency_for_kv_cache_config(vllm_config, sched),
                "groups": groups,
            }
        )
    )


if __name__ == "__main__":
    main()
