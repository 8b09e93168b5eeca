"""K/V bytes through the host tier: evicted blocks copied out, loaded back bit-exactly,
and paged attention on the host hit equal to attention on the original blocks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pagedkv import EngineConfig  # noqa: E402
from pagedkv.policies import TieredKVCacheManager, make_kv_cache_manager  # noqa: E402
from pagedkv.runtime import Request  # noqa: E402
from pagedkv.specs import FullAttentionSpec  # noqa: E402
from pagedkv.tensors import (  # noqa: E402
    ScheduledRequest,
    allocate_kv_cache,
    build_attention_metadata,
    gather_kv,
    paged_attention,
    write_kv,
)
from pagedkv.tensors.offload import HostKVBuffer  # noqa: E402
from tensors.configs import DEVICES, layer_outer_config  # noqa: E402

SPEC = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype="bfloat16")
LAYERS = ["L0", "L1"]


def step(manager, buffer, memory, req, num_new, gen, kv):  # type: ignore[no-untyped-def]
    """Allocate, run the step's copies (stores, then loads), write new K/V, attend."""
    hit = manager.get_computed_blocks(req) if req.num_computed_tokens == 0 else None
    computed = hit.num_computed_tokens if hit else req.num_computed_tokens
    blocks = hit.blocks if hit else None
    assert manager.allocate_slots(req, num_new, computed if hit else 0, blocks) is not None
    transfers = manager.take_transfers()
    for gid, pairs in transfers.stores.items():
        buffer.store(pairs, gid).wait()
    for gid, pairs in transfers.loads.items():
        buffer.load(pairs, gid).wait()
    req.num_computed_tokens = computed
    table = manager.get_block_ids(req.request_id)[0]
    sched = ScheduledRequest([table], computed, num_new)
    (meta,) = build_attention_metadata([sched], [SPEC.block_size], memory.device_buffer.device)
    out = {}
    queries = torch.randn(req.num_tokens, 4, SPEC.head_size, generator=gen)
    query = queries[computed : computed + num_new].to(meta.positions.device)
    for name in LAYERS:
        keys, values = kv[name]
        new = slice(computed, computed + num_new)
        write_kv(memory[name], meta.slot_mapping, keys[new], values[new])
        out[name] = paged_attention(memory[name], query, meta, compute_dtype=torch.float32)
    req.num_computed_tokens += num_new
    return hit, table, out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_kv_round_trips_through_the_host_tier(device: str, layout: str) -> None:
    config = layer_outer_config([(SPEC, LAYERS)], 8, layout=layout)
    manager = make_kv_cache_manager(
        config, EngineConfig.create(max_model_len=64), host_num_blocks=6
    )
    assert isinstance(manager, TieredKVCacheManager)
    memory = allocate_kv_cache(config, device)
    buffer = HostKVBuffer(memory, manager.host.num_blocks + 1)

    def random_kv(n: int, seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        shape = (n, SPEC.num_kv_heads, SPEC.head_size)
        return {
            name: (
                torch.randn(shape, generator=g).to(device, torch.bfloat16),
                torch.randn(shape, generator=g).to(device, torch.bfloat16),
            )
            for name in LAYERS
        }

    kv_a = random_kv(17, 0)
    a = Request("a", list(range(17)))
    _, table_a, _ = step(manager, buffer, memory, a, 17, torch.Generator().manual_seed(5), kv_a)
    original = {n: gather_kv(memory[n], torch.tensor(table_a), torch.arange(16)) for n in LAYERS}
    # Attention of the last token over a's own blocks, shaped as the later decode step.
    (meta,) = build_attention_metadata(
        [ScheduledRequest([table_a], 16, 1)], [SPEC.block_size], memory.device_buffer.device
    )
    query = torch.randn(17, 4, SPEC.head_size, generator=torch.Generator().manual_seed(5))
    out_a = {
        n: paged_attention(memory[n], query[16:].to(device), meta, compute_dtype=torch.float32)
        for n in LAYERS
    }
    manager.free(a)
    manager.new_step_starts()
    b = Request("b", list(range(100, 125)))  # 7 blocks: every block a had is reused
    step(manager, buffer, memory, b, 25, torch.Generator().manual_seed(6), random_kv(25, 1))
    manager.free(b)
    manager.new_step_starts()

    again = Request("a2", list(range(17)))
    hit, table, out = step(
        manager, buffer, memory, again, 1, torch.Generator().manual_seed(5), kv_a
    )
    assert (hit.num_device_tokens, hit.num_host_tokens) == (0, 16)
    assert set(table[:4]) & set(table_a[:4]), "the test should reuse a's device blocks"
    for name in LAYERS:
        keys, values = gather_kv(memory[name], torch.tensor(table), torch.arange(16))
        assert torch.equal(keys, original[name][0]) and torch.equal(values, original[name][1])
        # The same last query over the loaded blocks gives the same output, bit for bit.
        assert torch.equal(out[name], out_a[name])
