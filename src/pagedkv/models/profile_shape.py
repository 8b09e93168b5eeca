"""The sizes vLLM's start-up memory profile depends on, read from a config.

The adapters turn a config into cache layers and parameter counts (``ModelLayout``);
the profiling run also depends on the vocabulary, the MoE routing, a vision or audio
tower and how the checkpoint stores its weights. ``profile_shape`` reads those few
fields, with the layout's figures as fallbacks, so the memory model does not reach
into the adapters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from pagedkv.dtypes import dtype_size
from pagedkv.errors import ModelConfigError
from pagedkv.models.layers import AttentionLayer, LatentLayer, ModelLayout
from pagedkv.models.source import ModelSource

# Bits a weight takes in each stored format, scales and zero points included.
_FP8_BITS = 8.0
_MXFP4_BITS = 4.25  # 4-bit values plus one 8-bit scale per 32
_NVFP4_BITS = 4.5  # 4-bit values plus one fp8 scale per 16


class BytesPerParam(NamedTuple):
    """Bytes a stored weight takes, scales and zero points included."""

    dense_bytes: float  # per dense linear-layer parameter
    expert_bytes: float  # per MoE expert parameter


@dataclass(frozen=True)
class WeightFormat:
    """How the linear-layer weights are stored: bits per weight for dense and expert
    layers (None: the model dtype), and a label for the plan (``fp8``, ``awq 4-bit g128``)."""

    label: str
    dense_bits: float | None = None
    expert_bits: float | None = None
    # MoE kernels that pad each expert matrix: (hidden multiple, intermediate multiple).
    expert_padding: tuple[int, int] | None = None

    def bytes_per_param(self, dtype: str) -> BytesPerParam:
        """Bytes per dense linear and per expert parameter."""
        base = float(dtype_size(dtype))
        dense = base if self.dense_bits is None else self.dense_bits / 8
        expert = base if self.expert_bits is None else self.expert_bits / 8
        return BytesPerParam(dense, expert)

    def expert_scale(self, hidden_size: int, intermediate_per_rank: int) -> float:
        """How much the kernel's padding grows each expert matrix."""
        if self.expert_padding is None or not (hidden_size and intermediate_per_rank):
            return 1.0
        h_mult, i_mult = self.expert_padding
        padded_h = -(-hidden_size // h_mult) * h_mult
        padded_i = -(-intermediate_per_rank // i_mult) * i_mult
        return (padded_h * padded_i) / (hidden_size * intermediate_per_rank)


@dataclass(frozen=True)
class EncoderShape:
    """A vision or audio tower: its parameters and the tokens one dummy item gives it."""

    kind: str
    params: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    tokens_per_item: int


@dataclass(frozen=True)
class ProfileShape:
    """What the profiling run's tensors are shaped by, beyond the cache layers."""

    vocab_size: int
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    q_width: int = 0
    kv_width: int = 0
    weights: WeightFormat = WeightFormat("model dtype")
    encoders: tuple[EncoderShape, ...] = ()
    mtp_layers: int = 0


def _int(config: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _compressed_tensors(config: Mapping[str, Any], name: str) -> WeightFormat:
    groups = config.get("config_groups")
    weights = None
    if isinstance(groups, dict):
        for group in groups.values():
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                weights = group["weights"]
                break
    if weights is None:
        raise ModelConfigError(
            f"{name}: quantization_config (compressed-tensors) has no config_groups.*.weights; "
            "cannot tell how its weights are stored"
        )
    bits = float(weights.get("num_bits") or 8)
    size = weights.get("group_size")
    if weights.get("type") == "float":
        label = "nvfp4" if bits == 4 else f"fp{bits:g}"
        stored = _NVFP4_BITS if bits == 4 else bits
    else:
        label = f"int{bits:g}" + (f" g{size}" if isinstance(size, int) else "")
        zero = 0.0 if weights.get("symmetric", True) else bits
        stored = bits + (16 + zero) / size if isinstance(size, int) and size > 0 else bits
    return WeightFormat(f"{label} (compressed-tensors)", stored, stored)


def _grouped_bits(config: Mapping[str, Any]) -> float:
    bits = float(config.get("bits") or config.get("w_bit") or 4)
    group = config.get("group_size") or config.get("q_group_size") or 128
    zero = 0.0 if config.get("sym") is True else bits
    return bits + (16 + zero) / group if isinstance(group, int) and group > 0 else bits


def weight_format(quant: Any, name: str) -> WeightFormat:
    """The stored format a ``quantization_config`` describes (None: unquantized)."""
    if not isinstance(quant, Mapping):
        return WeightFormat("model dtype")
    method = str(quant.get("quant_method") or "").lower()
    if method in ("fp8", "fbgemm_fp8"):
        block = quant.get("weight_block_size")
        label = f"fp8 (block {block[0]}x{block[1]})" if isinstance(block, list) else "fp8"
        return WeightFormat(label, _FP8_BITS, _FP8_BITS)
    if method == "mxfp4":
        # vLLM's MXFP4 MoE kernels on NVIDIA (Marlin, TRT-LLM) round the hidden size
        # up to 256 and the intermediate size to 128 before allocating the experts.
        return WeightFormat("mxfp4 experts", None, _MXFP4_BITS, (256, 128))
    if method == "modelopt" or method == "modelopt_fp4":
        algo = str(quant.get("quant_algo") or quant.get("quantization", {}).get("quant_algo", ""))
        if "FP4" in algo.upper():
            return WeightFormat("nvfp4 (modelopt)", _NVFP4_BITS, _NVFP4_BITS)
        return WeightFormat("fp8 (modelopt)", _FP8_BITS, _FP8_BITS)
    if method == "compressed-tensors":
        return _compressed_tensors(quant, name)
    if method in ("awq", "gptq", "awq_marlin", "gptq_marlin", "auto-round", "auto_round"):
        bits = _grouped_bits(quant)
        group = quant.get("group_size") or quant.get("q_group_size")
        label = f"{method} {quant.get('bits') or quant.get('w_bit') or 4}-bit g{group}"
        return WeightFormat(label, bits, bits)
    if method == "bitsandbytes":
        if quant.get("load_in_4bit"):
            return WeightFormat("bitsandbytes 4-bit", 4.5, 4.5)  # one fp32 absmax per 64
        return WeightFormat("bitsandbytes 8-bit", 8.25, 8.25)
    raise ModelConfigError(
        f"{name}: quantization_config.quant_method {method!r} is a format pagedkv cannot size; "
        "give the weight bytes per worker (--weights)"
    )


def online_weight_format(quantization: str | None, stored: WeightFormat) -> WeightFormat:
    """``--quantization``: ``fp8`` on an unquantized checkpoint quantises its linear
    layers at load; a method the checkpoint already declares changes nothing."""
    if quantization in (None, "", "auto") or stored.label != "model dtype":
        return stored
    if quantization == "fp8":
        return WeightFormat("fp8 (online, --quantization fp8)", _FP8_BITS, _FP8_BITS)
    return stored


def _encoder(kind: str, config: Any) -> EncoderShape | None:
    if not isinstance(config, Mapping):
        return None
    hidden = _int(config, "hidden_size", "d_model", "embed_dim")
    inter = _int(config, "intermediate_size", "encoder_ffn_dim", default=4 * hidden)
    layers = _int(config, "num_hidden_layers", "encoder_layers", "depth")
    if not (hidden and layers):
        return None
    image, patch = _int(config, "image_size"), _int(config, "patch_size", default=14)
    tokens = (image // patch) ** 2 if image else _int(config, "default_output_length") or 256
    # A pooling tower (Gemma's) runs k*k patches per output token.
    tokens *= _int(config, "pooling_kernel_size", default=1) ** 2
    params = layers * (4 * hidden * hidden + 2 * hidden * inter)
    return EncoderShape(kind, params, hidden, inter, layers, tokens)


def _attention_widths(layout: ModelLayout) -> tuple[int, int]:
    q_width = kv_width = 0
    for layer in layout.layers:
        if isinstance(layer, AttentionLayer):
            q_width = max(q_width, layer.num_heads * layer.head_size)
            kv_width = max(kv_width, 2 * layer.num_kv_heads * layer.head_size)
        elif isinstance(layer, LatentLayer):
            q_width = max(q_width, layer.num_heads * layer.latent_size)
            kv_width = max(kv_width, layer.latent_size)
    return q_width, kv_width


def profile_shape(layout: ModelLayout, source: ModelSource | None = None) -> ProfileShape:
    """The profile's shapes: from ``source``'s config when given, else what the layout holds."""
    vocab = layout.embedding_params // max(layout.hidden_size, 1)
    q_width, kv_width = _attention_widths(layout)
    if source is None:
        return ProfileShape(vocab_size=vocab, q_width=q_width, kv_width=kv_width)
    text, raw = source.text_config, source.raw
    quant = raw.get("quantization_config") or text.get("quantization_config")
    encoders = tuple(
        enc
        for kind in ("vision", "audio")
        if (enc := _encoder(kind, raw.get(f"{kind}_config"))) is not None
    )
    return ProfileShape(
        vocab_size=_int(text, "vocab_size", default=vocab) or vocab,
        num_experts=_int(text, "num_local_experts", "num_experts", "n_routed_experts"),
        experts_per_token=_int(text, "num_experts_per_tok", "top_k_experts", "moe_topk"),
        moe_intermediate_size=_int(text, "moe_intermediate_size", "intermediate_size"),
        shared_expert_intermediate_size=_int(text, "shared_expert_intermediate_size"),
        q_width=q_width,
        kv_width=kv_width,
        weights=weight_format(quant, source.name),
        encoders=encoders,
        mtp_layers=_int(text, "num_nextn_predict_layers", "mtp_num_hidden_layers"),
    )


__all__ = [
    "BytesPerParam",
    "EncoderShape",
    "ProfileShape",
    "WeightFormat",
    "online_weight_format",
    "profile_shape",
    "weight_format",
]
