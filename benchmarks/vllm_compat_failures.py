"""The "Tests still failing, and why" section of docs/vllm-compat.md, from a run of vLLM's
own suite against ``pagedkv.compat.vllm`` (``results.tsv`` in the run's ``$OUT``).

    OUT=/tmp/vt bash ../shared/tools/vllm_tests/run.sh
    python benchmarks/vllm_compat_failures.py /tmp/vt/results.tsv > section.md

Each failing test is named once, under the first rule below its first error line matches;
the rest are listed with that error line.
"""

from __future__ import annotations

import collections
import re
import sys

RULES = [
    (
        r"hisparse|HiSparse",
        "HiSparse host tier (vLLM's HiSparse coordinator, layout and connector)",
    ),
    (
        r"lookahead|use_eagle|eagle|session_id|emit_cached_block_events|report_mode",
        "speculative decoding / KV event API details not yet translated",
    ),
    (
        r"Scheduler|_mamba_block_aligned_split|_get_local_prefix_cache_hit|_free_cow",
        "vLLM's scheduler",
    ),
    (
        r"onnector|external computed|boundary_state_offload|partial_tail_offload"
        r"|MockKV|kv_transfer",
        "KV connectors and their offload bookkeeping",
    ),
    (r"context parallelism|pcp", "prefill context parallelism"),
    (
        r"FreeKVCacheBlockQueue|fake_free_list|_ListEnd",
        "vLLM's linked-list free queue (pagedkv's free queue is its own structure)",
    ),
    (
        r"add_kv_sharing|kv_sharing",
        "cross-layer KV sharing at the worker (add_kv_sharing_layers_to_kv_cache_groups)",
    ),
    (
        r"TritonAttentionBackend|resolve_kv_cache_layout|sparse_utils|flat_kv_row_view|customize_spec",
        "attention backends (layout negotiation, kernels)",
    ),
    (
        r"planning|get_kv_cache_config|get_global|unify|_get_packed|_pool_bytes|kv_cache_layout"
        r"|[Bb]uilder|device_count|generate_scheduler|get_kv_cache_capacity|get_max_concurrency"
        r"|estimate_max|check_enough|_project|SimpleNamespace|MagicMock|ConfigPart"
        r"|is_encoder_decoder|VllmConfig",
        "vLLM's planner and config API, not yet translated onto pagedkv's planner",
    ),
    (
        r"_checkpoints|_allocated_block_reqs|reachable_block_mask|take_new_block_ids|_relocate"
        r"|take_pending",
        "vLLM manager internals pagedkv's managers keep differently",
    ),
    (
        r"resolve_block_hashes|tensor_data|MultiModal|mm_",
        "vLLM request/multimodal helpers not translated",
    ),
]


def reason_for(error: str) -> str:
    for pattern, reason in RULES:
        if re.search(pattern, error):
            return reason
    line = re.sub(r"0x[0-9a-f]+", "", (error or "no error line").strip())[:110].replace("|", "/")
    return f"behaviour or API difference: `{line}`"


def main(path: str) -> None:
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f][1:]
    by_test: dict[tuple[str, str, str], list[str]] = collections.defaultdict(list)
    for test_id, vllm, ours, error in rows:
        if vllm != "passed" or ours == "passed":
            continue
        file, _, name = test_id.partition("::")
        by_test[(file, re.sub(r"\[.*\]$", "", name), reason_for(error))].append(test_id)
    counts: collections.Counter[str] = collections.Counter()
    for (_, _, reason), ids in by_test.items():
        counts[reason] += len(ids)
    print("| reason | tests |\n|---|---|")
    for reason, n in counts.most_common():
        print(f"| {reason} | {n} |")
    current = None
    for (file, name, reason), ids in sorted(by_test.items()):
        if file != current:
            print(f"\n### `{file}`\n")
            current = file
        cases = f" ({len(ids)} cases)" if len(ids) > 1 else ""
        print(f"- `{name}`{cases}: {reason}")


if __name__ == "__main__":
    main(sys.argv[1])
