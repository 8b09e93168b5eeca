"""Replays a vLLM 0.33 golden recording (data/FORMAT.md) through pagedkv's public API.

``replay(path)`` yields nothing and raises ``GoldenMismatch`` at the first difference,
naming the file, the op index, the field, and the expected and actual values.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from pagedkv import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    RSWASpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)
from pagedkv.runtime import KVCacheBlocks, KVCacheManager, LoRA, Request


class GoldenMismatch(AssertionError):
    pass


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    if data.get("format") != "vllm-kv-golden/1":
        raise GoldenMismatch(f"{path.name}: unknown format {data.get('format')!r}")
    return data


def _attention(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_size": spec["block_size"],
        "num_kv_heads": spec["num_kv_heads"],
        "head_size": spec["head_size"],
        "dtype": spec["dtype"],
    }


def build_spec(kind: str, spec: dict[str, Any]) -> KVCacheSpec:
    if kind == "FullAttentionSpec":
        return FullAttentionSpec(**_attention(spec))
    if kind == "MLAAttentionSpec":
        return MLAAttentionSpec(**_attention(spec))
    if kind == "SlidingWindowSpec":
        return SlidingWindowSpec(**_attention(spec), sliding_window=spec["sliding_window"])
    if kind == "ChunkedLocalAttentionSpec":
        return ChunkedLocalAttentionSpec(
            **_attention(spec), attention_chunk_size=spec["attention_chunk_size"]
        )
    if kind == "MambaSpec":
        return MambaSpec(
            block_size=spec["block_size"],
            shapes=tuple(tuple(s) for s in spec["shapes"]),
            dtypes=tuple(spec["dtypes"]),
            page_size_padded=spec["page_size_padded"],
            mamba_cache_mode=spec["mamba_cache_mode"],
        )
    new_kind = build_rt_kinds_spec(kind, spec)
    if new_kind is None:
        raise GoldenMismatch(f"no pagedkv spec for vLLM kind {kind!r}")
    return new_kind


def build_rt_kinds_spec(kind: str, spec: dict[str, Any]) -> KVCacheSpec | None:
    """The spec kinds the format-2 layouts ``rswa``, ``swa_mla`` and ``ring`` add (None
    for any other kind)."""
    if kind == "RSWASpec":
        return RSWASpec(**_attention(spec), rswa_window=spec["rswa_window"])
    if kind == "SlidingWindowMLASpec":
        return SlidingWindowMLASpec(
            **_attention(spec),
            sliding_window=spec["sliding_window"],
            extra_retained_tokens=spec.get("extra_retained_tokens", 0),
            cache_dtype_str=spec.get("cache_dtype_str"),
            alignment=spec.get("alignment"),
            model_version=spec.get("model_version"),
            bounded_replay=spec.get("bounded_replay", False),
        )
    if kind == "CircularBufferSpec":
        return CircularBufferSpec(**_attention(spec), head_size_v=spec["head_size_v"])
    return None


def build_manager(layout: dict[str, Any]) -> KVCacheManager:
    groups = tuple(
        KVCacheGroupSpec(
            layer_names=tuple(g["layer_names"]), kv_cache_spec=build_spec(g["kind"], g["spec"])
        )
        for g in layout["kv_cache_groups"]
    )
    kv = KVCacheConfig(
        num_blocks=layout["num_blocks"],
        kv_cache_tensors=(),
        kv_cache_groups=groups,
        max_model_len=layout["max_model_len"],
    )
    config = EngineConfig.create(
        max_model_len=layout["max_model_len"],
        block_size=layout["block_size"],
        max_num_batched_tokens=layout["max_in_flight_tokens"],
        max_num_seqs=layout["max_num_seqs"],
    )
    return KVCacheManager(
        kv, config, hash_algo=layout["hash_fn"], hash_seed=layout["none_hash_seed"]
    )


def build_request(rid: str, rec: dict[str, Any]) -> Request:
    lora = rec["lora"]
    return Request(
        rid,
        rec["prompt"],
        cache_salt=rec["cache_salt"],
        lora=None
        if lora is None
        else LoRA(lora["lora_name"], lora["lora_int_id"], lora["lora_path"]),
    )


def _check(name: str, index: int, op: dict[str, Any], field: str, expected: Any, got: Any) -> None:
    if expected != got:
        where = f"{name}: op {index} ({op['op']}{' ' + op['req'] if 'req' in op else ''})"
        raise GoldenMismatch(f"{where}: {field}: expected {expected!r}, got {got!r}")


def replay(path: Path) -> int:
    """Replay every op of the recording at ``path``; returns the number of ops."""
    data = load(path)
    name = path.name
    manager = build_manager(data["layout"])
    requests = {rid: build_request(rid, rec) for rid, rec in data["requests"].items()}
    lookups: dict[str, KVCacheBlocks] = {}
    live: set[str] = set()
    for index, op in enumerate(data["ops"]):
        kind = op["op"]
        result = op.get("result")
        req = requests.get(op.get("req", ""))
        if kind == "new_step_starts":
            manager.new_step_starts()
        elif kind == "get_computed_blocks":
            assert req is not None
            blocks, num_hit = manager.get_computed_blocks(req)
            got = {
                "num_computed_tokens": num_hit,
                "shared_prefix_boundary": req.shared_prefix_boundary,
                "block_ids": [list(ids) for ids in blocks.get_block_ids()],
            }
            for field in got:
                _check(name, index, op, field, result[field], got[field])
            req.shared_prefix_boundary = result["shared_prefix_boundary"]
            lookups[req.request_id] = blocks
        elif kind == "allocate_slots":
            assert req is not None
            req.num_computed_tokens = op["num_computed_tokens"]
            _check(name, index, op, "num_tokens", op["num_tokens"], req.num_tokens)
            out = manager.allocate_slots(
                req,
                op["num_new_tokens"],
                op["num_new_computed_tokens"],
                lookups.pop(req.request_id) if op["use_computed_blocks"] else None,
                full_sequence_must_fit=op["full_sequence_must_fit"],
                has_scheduled_reqs=op["has_scheduled_reqs"],
            )
            _check(name, index, op, "ok", result["ok"], out is not None)
            if out is not None:
                got_ids = [list(ids) for ids in out.get_block_ids()]
                _check(name, index, op, "new_block_ids", result["new_block_ids"], got_ids)
                live.add(req.request_id)
        elif kind == "append_output":
            assert req is not None
            req.append_output_token_ids(op["token"])
        elif kind == "free":
            assert req is not None
            manager.free(req)
            live.discard(req.request_id)
        elif kind == "reset_prefix_cache":
            _check(name, index, op, "ok", result["ok"], manager.reset_prefix_cache())
        else:
            raise GoldenMismatch(f"{name}: op {index}: unknown op {kind!r}")
        state = op["state"]
        _check(
            name, index, op, "num_free_blocks", state["num_free_blocks"], manager.num_free_blocks
        )
        tables = {rid: [list(ids) for ids in manager.get_block_ids(rid)] for rid in live}
        _check(name, index, op, "blocks", state["blocks"], tables)
    return len(data["ops"])
