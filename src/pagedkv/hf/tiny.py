"""A model config shrunk to a few layers and a small hidden size, with seeded weights.

The layer pattern is kept: which layers are sliding, chunked, global, latent or Mamba,
their windows, chunk sizes and state sizes (``d_state``, ``d_conv``, ``kv_lora_rank``,
head sizes of the state). What shrinks is what does not change the cache's shape per
token: layer count, hidden and MLP sizes, expert counts, query heads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from pagedkv.errors import ModelConfigError

__all__ = [
    "TINY_HIDDEN",
    "TINY_HEADS",
    "TINY_HEAD_DIM",
    "tiny_num_layers",
    "tiny_changes",
    "tiny_config",
    "seeded_model",
]

TINY_HIDDEN = 64
TINY_HEADS = 4
TINY_HEAD_DIM = 16

# Plain sizes that only set compute, not the cache: shrunk outright when present.
_SIZES: dict[str, int] = {
    "hidden_size": TINY_HIDDEN,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "intermediate_size_mlp": 128,
    "num_local_experts": 4,
    "num_experts": 4,
    "n_routed_experts": 4,
}
_AT_MOST: dict[str, int] = {
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_token": 2,
    "top_k_experts": 2,
}


def _layer_kinds(config: Any) -> list[str]:
    kinds = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if kinds:
        return [str(k) for k in kinds]
    no_rope = getattr(config, "no_rope_layers", None)
    if no_rope:
        return [str(k) for k in no_rope]
    return ["layer"] * int(config.num_hidden_layers)


def tiny_num_layers(config: Any, minimum: int = 2) -> int:
    """The shortest prefix of the layer pattern that holds every kind of layer."""
    kinds = _layer_kinds(config)
    seen: set[str] = set()
    wanted = set(kinds)
    for i, kind in enumerate(kinds):
        seen.add(kind)
        if seen == wanted:
            return min(len(kinds), max(minimum, i + 1))
    return min(len(kinds), minimum)


def _tiny_kv_heads(heads: int, kv_heads: int) -> int:
    """Key/value heads for :data:`TINY_HEADS` query heads, keeping the group size."""
    return max(1, TINY_HEADS // max(1, heads // kv_heads))


def _shrink_heads(fields: dict[str, Any], changes: dict[str, Any], layers: int) -> None:
    heads = fields.get("num_attention_heads")
    if not isinstance(heads, int) or not heads:
        return
    kv = fields.get("num_key_value_heads") or heads
    changes["num_attention_heads"] = TINY_HEADS
    if "num_key_value_heads" in fields:
        changes["num_key_value_heads"] = _tiny_kv_heads(heads, kv)
    if fields.get("kv_lora_rank"):
        return  # MLA: head sizes are the latent's shape, kept
    head_dim = fields.get("head_dim")
    for name in ("head_dim", "attention_head_dim"):  # Nemotron-H publishes both
        if name in fields:
            changes[name] = TINY_HEAD_DIM
    per_layer = fields.get("per_layer_config")
    if isinstance(per_layer, dict) and isinstance(head_dim, int):
        # layers with their own head size and KV heads (Gemma 4's global layers) keep
        # their ratio to the others
        changes["per_layer_config"] = {
            index: {
                **over,
                **(
                    {"head_dim": TINY_HEAD_DIM * over["head_dim"] // head_dim}
                    if "head_dim" in over
                    else {}
                ),
                **(
                    {"num_key_value_heads": _tiny_kv_heads(heads, over["num_key_value_heads"])}
                    if "num_key_value_heads" in over
                    else {}
                ),
            }
            for index, over in per_layer.items()
            if int(index) < layers
        }


def _shrink_mamba_heads(fields: dict[str, Any], changes: dict[str, Any]) -> None:
    """Mamba-2 head count follows the (shrunk) inner size; head size, state size, conv
    width and groups, which set the state's shape per head, are kept."""
    expand = fields.get("mamba_expand") or fields.get("expand")
    pairs = [("mamba_n_heads", "mamba_d_head"), ("mamba_num_heads", "mamba_head_dim")]
    if not fields.get("num_attention_heads"):  # transformers' Mamba-2: num_heads, head_dim
        pairs.append(("num_heads", "head_dim"))
    for heads, head_dim in pairs:
        if isinstance(fields.get(heads), int) and isinstance(fields.get(head_dim), int) and expand:
            changes[heads] = max(1, int(expand * TINY_HIDDEN) // fields[head_dim])
            for groups in ("n_groups", "mamba_n_groups"):  # groups must divide the heads
                if isinstance(fields.get(groups), int):
                    changes[groups] = math.gcd(fields[groups], changes[heads])
            if isinstance(fields.get("mamba_d_ssm"), int):  # Falcon-H1's explicit inner size
                changes["mamba_d_ssm"] = changes[heads] * fields[head_dim]
    value_heads = fields.get("linear_num_value_heads")
    key_heads = fields.get("linear_num_key_heads")
    if isinstance(value_heads, int) and isinstance(key_heads, int):  # gated DeltaNet
        changes["linear_num_value_heads"] = TINY_HEADS
        changes["linear_num_key_heads"] = max(1, TINY_HEADS * key_heads // value_heads)
    if isinstance(fields.get("mamba_dt_rank"), int):
        changes["mamba_dt_rank"] = -(-TINY_HIDDEN // 16)


def tiny_changes(config: Any, *, num_layers: int | None = None) -> dict[str, Any]:
    """The attribute changes that make ``config`` tiny (see the module docstring)."""
    changes: dict[str, Any] = {}
    fields = config.to_dict()
    for name, value in _SIZES.items():
        if fields.get(name) is not None:
            changes[name] = value
    for name, value in _AT_MOST.items():
        if isinstance(fields.get(name), int):
            changes[name] = min(fields[name], value)
    layers = tiny_num_layers(config) if num_layers is None else num_layers
    _shrink_heads(fields, changes, layers)
    _shrink_mamba_heads(fields, changes)
    original = int(config.num_hidden_layers)
    changes["num_hidden_layers"] = layers
    for name, value in fields.items():  # per-layer lists (layer_types, mlp_layer_types...)
        if isinstance(value, list) and len(value) == original and name not in changes:
            changes[name] = value[:layers]
    return changes


def tiny_config(config: Any, *, num_layers: int | None = None, **overrides: Any) -> Any:
    """A copy of a transformers config, shrunk; ``overrides`` are set last (e.g. a
    smaller ``sliding_window`` or ``vocab_size`` for fast tests)."""
    changes = tiny_changes(config, num_layers=num_layers) | overrides
    fields = config.to_dict() | changes
    try:
        tiny = config.__class__.from_dict(fields | _special_tokens_in_vocab(fields))
    except Exception as exc:  # validators raise huggingface_hub's own error classes too
        raise ModelConfigError(
            f"--tiny: the shrunk {getattr(config, 'model_type', '?')!r} config is invalid "
            f"({_first_line(exc)}); shrunk fields: {', '.join(sorted(changes))}"
        ) from None
    tiny.dtype = torch.float32
    tiny.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
    return tiny


def _special_tokens_in_vocab(fields: Mapping[str, Any]) -> dict[str, Any]:
    """Special token ids past a shrunk vocabulary: padding becomes 0, others none."""
    vocab = int(fields["vocab_size"])
    changes: dict[str, Any] = {}
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = fields.get(name)
        ids = value if isinstance(value, list) else [value]
        if any(isinstance(i, int) and i >= vocab for i in ids):
            changes[name] = 0 if name == "pad_token_id" else None
    return changes


def seeded_model(config: Any, seed: int = 0, init_std: float = 0.5) -> Any:
    """A causal LM with random float32 weights drawn from ``seed``.

    Weights are redrawn with a larger spread than transformers' init so the random
    model's next-token choice depends strongly on the context (with tiny initial
    weights every logit is near zero and greedy decoding repeats one token).
    """
    from transformers import AutoModelForCausalLM

    model_type = getattr(config, "model_type", "?")
    if type(config) not in AutoModelForCausalLM._model_mapping:
        raise ModelConfigError(
            f"transformers has no causal LM for model_type {model_type!r} "
            "(pagedkv.hf runs decoder-only models)"
        )
    try:
        # transformers draws some weights it does not expose as plain init (Mamba's
        # dt_bias, ...) from the global generator: seed it too, without disturbing it
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    except Exception as exc:  # validators raise huggingface_hub's own error classes too
        raise ModelConfigError(
            f"transformers cannot build a {model_type!r} causal LM from this config: "
            f"{_first_line(exc)}"
        ) from None
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            _redraw(name, param, generator, init_std)
    return model.eval()


def _first_line(exc: BaseException) -> str:
    """The exception's message on one line (transformers' validation errors span several)."""
    return " ".join(str(exc).split())


def _redraw(name: str, param: torch.Tensor, generator: torch.Generator, std: float) -> None:
    if param.ndim < 2:
        # norms, biases, per-head scalars: keep near their neutral values
        noise = torch.randn(param.shape, generator=generator) * 0.1
        param.copy_(param + noise.to(param.dtype))
        return
    scale = std / max(1.0, float(param.shape[-1]) ** 0.5)
    param.copy_(torch.randn(param.shape, generator=generator) * scale * 4)
