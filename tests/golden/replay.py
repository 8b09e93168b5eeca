"""Replays a vLLM 0.33 golden recording through pagedkv's public API.

Format 1 (``data/FORMAT.md``) and format 2 (``data_next/FORMAT.md``: manager options, lookahead
slots, ``cache_blocks``, ``take_events`` and ``release_cow_copies`` ops, more spec kinds).
``replay(path)`` raises ``GoldenMismatch`` at the first difference, naming the file, the op
index, the field, and the expected and actual values.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any

import msgspec

import pagedkv
from pagedkv import (
    ChunkedLocalAttentionSpec,
    EngineConfig,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from pagedkv.events.wire import to_external
from pagedkv.runtime import KVCacheBlocks, KVCacheManager, LoRA, Request

FORMATS = ("vllm-kv-golden/1", "vllm-kv-golden/2")


class GoldenMismatch(AssertionError):
    pass


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as f:
        data: dict[str, Any] = json.load(f)
    if data.get("format") not in FORMATS:
        raise GoldenMismatch(f"{path.name}: unknown format {data.get('format')!r}")
    return data


def is_format_2(data_or_layout: dict[str, Any]) -> bool:
    return "manager_kwargs" in data_or_layout.get("layout", data_or_layout)


def _attention(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "block_size": spec["block_size"],
        "num_kv_heads": spec["num_kv_heads"],
        "head_size": spec["head_size"],
        "dtype": spec["dtype"],
    }


def build_spec(kind: str, spec: dict[str, Any]) -> KVCacheSpec:
    """A format-1 group spec (the six original kinds and their recorded fields)."""
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
    raise GoldenMismatch(f"no pagedkv spec for vLLM kind {kind!r}")


# vLLM spec fields that change neither a block's size nor a manager's behaviour in these
# recordings (DCP/TP sharding, kernel layout hints, per-head bookkeeping).
_INERT_FIELDS = frozenset(
    {
        "dcp_sharded",
        "max_tp_shards",
        "head_size_v",
        "tokens_per_state",
        "num_heads",
        "tp_replicated",
        "cache_role",
        "is_index_group_leader",
        "non_causal_multi_token_decode",
    }
)
# A field pagedkv's spec lacks may still be recorded at vLLM's "off" value.
_OFF_VALUES: tuple[Any, ...] = (None, False, 0, "NONE", "auto")


def _json_value(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_json_value(v) for v in value)
    return value


def build_spec_v2(kind: str, recorded: dict[str, Any], page_size_bytes: int) -> KVCacheSpec:
    """A format-2 group spec: pagedkv's class of the same name, built from every recorded
    field it has. A recorded field it lacks must be inert or off; the page size must match."""
    cls = getattr(pagedkv, kind, None)
    if cls is None or not (isinstance(cls, type) and issubclass(cls, KVCacheSpec)):
        raise GoldenMismatch(f"no pagedkv spec for vLLM kind {kind!r}")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {k: _json_value(v) for k, v in recorded.items() if k in names}
    missing = {
        k: v
        for k, v in recorded.items()
        if k not in names and k not in _INERT_FIELDS and v not in _OFF_VALUES
    }
    if missing:
        raise GoldenMismatch(f"pagedkv's {kind} has no field for recorded {missing!r}")
    spec: KVCacheSpec = cls(**kwargs)
    if spec.page_size_bytes != page_size_bytes:
        raise GoldenMismatch(
            f"{kind}: page_size_bytes: expected {page_size_bytes}, got {spec.page_size_bytes}"
        )
    return spec


def _group(layout_group: dict[str, Any], v2: bool) -> KVCacheGroupSpec:
    kind, recorded = layout_group["kind"], layout_group["spec"]
    if not v2:
        spec = build_spec(kind, recorded)
        return KVCacheGroupSpec(layer_names=tuple(layout_group["layer_names"]), kv_cache_spec=spec)
    spec = build_spec_v2(kind, recorded, layout_group["page_size_bytes"])
    extra: dict[str, Any] = {}
    if layout_group.get("is_eagle_group"):
        extra["is_eagle_group"] = True
    return KVCacheGroupSpec(
        layer_names=tuple(layout_group["layer_names"]),
        kv_cache_spec=spec,
        role=layout_group.get("role", "default"),
        **extra,
    )


def manager_options(layout: dict[str, Any]) -> dict[str, Any]:
    """pagedkv ``KVCacheManager`` keywords for a format-2 layout's vLLM manager arguments.

    Options at vLLM's default are left out, so a format-2 file without the feature builds the
    manager exactly as format 1 does."""
    kwargs = layout["manager_kwargs"]
    options: dict[str, Any] = {
        "enable_caching": kwargs["enable_caching"],
        "enable_events": kwargs["enable_kv_cache_events"],
        "watermark": kwargs["watermark"],
    }
    optional = {
        "use_eagle": kwargs["use_eagle"],
        "num_hash_lookahead_tokens": kwargs["num_hash_lookahead_tokens"],
        "num_prefill_lookahead": kwargs["num_prefill_lookahead"],
        "enable_mamba_shared_prefix_checkpoint": kwargs["enable_mamba_shared_prefix_checkpoint"],
    }
    options.update({k: v for k, v in optional.items() if v})
    if layout["hash_block_size"] != layout["scheduler_block_size"]:
        options["hash_block_size"] = layout["hash_block_size"]
    interval = layout["resolved_prefix_cache_retention_interval"]
    if interval != 0:
        options["prefix_cache_retention_interval"] = interval
    return options


def build_manager(layout: dict[str, Any]) -> KVCacheManager:
    v2 = is_format_2(layout)
    groups = tuple(_group(g, v2) for g in layout["kv_cache_groups"])
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
    options = manager_options(layout) if v2 else {}
    return KVCacheManager(
        kv, config, hash_algo=layout["hash_fn"], hash_seed=layout["none_hash_seed"], **options
    )


def build_request(rid: str, rec: dict[str, Any]) -> Request:
    lora = rec["lora"]
    extra: dict[str, Any] = {}
    if rec.get("kv_cache_report_mode") not in (None, "incremental"):
        extra["kv_cache_report_mode"] = rec["kv_cache_report_mode"]
    return Request(
        rid,
        rec["prompt"],
        cache_salt=rec["cache_salt"],
        lora=None
        if lora is None
        else LoRA(lora["lora_name"], lora["lora_int_id"], lora["lora_path"]),
        **extra,
    )


def event_record(event: Any) -> dict[str, Any]:
    """An event as the recordings write it: the class name, then every field in declaration
    order, hashes in vLLM's external form (low 64 bits as an int), tuples as lists."""
    external = to_external(event)
    fields = msgspec.structs.asdict(external)
    record: dict[str, Any] = {"type": type(event).__name__, **fields}
    return json.loads(json.dumps(record))


def release_cow_copies(manager: KVCacheManager) -> list[list[int]]:
    """The end of vLLM's ``Scheduler.schedule()``: this step's copy-on-write copies, after
    which the references that kept their blocks alive go back to the pool."""
    return [list(pair) for pair in manager.release_cow_copies()]


def _check(name: str, index: int, op: dict[str, Any], field: str, expected: Any, got: Any) -> None:
    if expected != got:
        where = f"{name}: op {index} ({op['op']}{' ' + op['req'] if 'req' in op else ''})"
        raise GoldenMismatch(f"{where}: {field}: expected {expected!r}, got {got!r}")


def _check_events(name: str, index: int, op: dict[str, Any], events: list[Any]) -> None:
    expected = op["result"]["events"]
    got = [event_record(e) for e in events]
    _check(name, index, op, "events (count)", len(expected), len(got))
    for position, (want, have) in enumerate(zip(expected, got, strict=True)):
        for field in want:
            _check(name, index, op, f"events[{position}].{field}", want[field], have.get(field))


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
                num_lookahead_tokens=op.get("num_lookahead_tokens", 0),
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
        elif kind == "cache_blocks":
            assert req is not None
            req.num_computed_tokens = op["num_computed_tokens"]
            _check(name, index, op, "num_tokens", op["num_tokens"], req.num_tokens)
            manager.cache_blocks(req, op["num_computed_tokens"])
        elif kind == "free":
            assert req is not None
            manager.free(req)
            live.discard(req.request_id)
        elif kind == "reset_prefix_cache":
            _check(name, index, op, "ok", result["ok"], manager.reset_prefix_cache())
        elif kind == "take_events":
            _check_events(name, index, op, manager.take_events())
        elif kind == "release_cow_copies":
            _check(name, index, op, "copies", result["copies"], release_cow_copies(manager))
        else:
            raise GoldenMismatch(f"{name}: op {index}: unknown op {kind!r}")
        state = op["state"]
        _check(
            name, index, op, "num_free_blocks", state["num_free_blocks"], manager.num_free_blocks
        )
        tables = {rid: [list(ids) for ids in manager.get_block_ids(rid)] for rid in live}
        _check(name, index, op, "blocks", state["blocks"], tables)
    return len(data["ops"])
