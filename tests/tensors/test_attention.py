"""Block tables, slot mapping and the reference paged attention against dense attention."""

from __future__ import annotations

import math

import pytest

from pagedkv.specs import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
)

torch = pytest.importorskip("torch")

from pagedkv.tensors import (  # noqa: E402
    AttentionWindow,
    BlockTableError,
    ScheduledRequest,
    allocate_kv_cache,
    attend,
    block_table_tensor,
    build_attention_metadata,
    paged_attention,
    slot_mapping,
    window_for_spec,
    write_kv,
)

from .configs import DEVICES, layer_outer_config  # noqa: E402


def test_slot_mapping_follows_the_block_table() -> None:
    slots = slot_mapping([7, 2, 9], torch.arange(3, 11), block_size=4)
    assert slots.tolist() == [31, 8, 9, 10, 11, 36, 37, 38]
    with pytest.raises(BlockTableError, match="position 12"):
        slot_mapping([7, 2, 9], torch.tensor([12]), block_size=4)


def test_block_table_is_padded_with_the_null_block() -> None:
    table = block_table_tensor([[3, 4], [5], []])
    assert table.dtype == torch.int32 and table.tolist() == [[3, 4], [5, 0], [0, 0]]
    assert block_table_tensor([[1]], width=3).tolist() == [[1, 0, 0]]
    with pytest.raises(BlockTableError, match="row 0"):
        block_table_tensor([[1, 2]], width=1)


def test_metadata_per_group_with_different_block_sizes() -> None:
    first = ScheduledRequest(([5, 6], [9]), num_computed_tokens=3, num_new_tokens=2)
    second = ScheduledRequest(([1], [2]), num_computed_tokens=0, num_new_tokens=3)
    by4, by8 = build_attention_metadata([first, second], block_sizes=[4, 8])
    assert by4.positions.tolist() == [3, 4, 0, 1, 2]
    assert by4.query_start_loc.tolist() == [0, 2, 5] and by4.seq_lens.tolist() == [5, 3]
    assert by4.slot_mapping.tolist() == [23, 24, 4, 5, 6]
    assert by8.slot_mapping.tolist() == [75, 76, 16, 17, 18]
    assert by4.block_table.tolist() == [[5, 6], [1, 0]] and by8.block_table.tolist() == [[9], [2]]
    assert by4.block_size == 4 and by8.block_size == 8


def naive_attention(q, k, v, q_pos, window: AttentionWindow):
    """One query and head at a time, straight from the definition."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for t, p in enumerate(q_pos.tolist()):
        start = int(window.key_start(torch.tensor([p]))[0])
        for h in range(q.shape[1]):
            keys = range(start, p + 1)
            logits = [float(q[t, h] @ k[j, h // group]) / math.sqrt(q.shape[-1]) for j in keys]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            for w, j in zip(weights, keys):
                out[t, h] += w / sum(weights) * v[j, h // group]
    return out


@pytest.mark.parametrize(
    "window", [AttentionWindow(), AttentionWindow(sliding_window=3), AttentionWindow(chunk_size=4)]
)
def test_attend_matches_the_definition(window: AttentionWindow) -> None:
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(10, 2, 4, generator=gen, dtype=torch.float64)
    v = torch.randn(10, 2, 3, generator=gen, dtype=torch.float64)
    q = torch.randn(4, 4, 4, generator=gen, dtype=torch.float64)
    q_pos = torch.tensor([2, 6, 7, 9])
    got = attend(q, k, v, q_pos, torch.arange(10), window)
    torch.testing.assert_close(got, naive_attention(q, k, v, q_pos, window))


def test_windows_of_specs() -> None:
    common = dict(block_size=4, num_kv_heads=1, head_size=4)
    assert window_for_spec(FullAttentionSpec(**common)) == AttentionWindow()
    assert window_for_spec(SlidingWindowSpec(**common, sliding_window=5)).sliding_window == 5
    chunked = ChunkedLocalAttentionSpec(**common, attention_chunk_size=8)
    assert window_for_spec(chunked).chunk_size == 8
    promoted = FullAttentionSpec(**common, sliding_window=6)
    assert window_for_spec(promoted) == AttentionWindow(sliding_window=6)
    assert AttentionWindow(sliding_window=4).key_start(torch.tensor([7, 2])).tolist() == [4, 0]
    assert AttentionWindow(chunk_size=8).key_start(torch.tensor([13, 8, 7])).tolist() == [8, 8, 0]


SPECS = {
    "full": FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype="float32"),
    "window": SlidingWindowSpec(
        block_size=4, num_kv_heads=2, head_size=8, dtype="float32", sliding_window=5
    ),
    "chunk": ChunkedLocalAttentionSpec(
        block_size=4, num_kv_heads=2, head_size=8, dtype="float32", attention_chunk_size=8
    ),
    "mla": MLAAttentionSpec(block_size=4, head_size=8, dtype="float32"),
    "mla_window": SlidingWindowMLASpec(
        block_size=4, head_size=8, dtype="float32", sliding_window=6
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kind", list(SPECS))
def test_paged_attention_equals_dense_history(device: str, layout: str, kind: str) -> None:
    """Two requests over scattered blocks, a chunked prefill then decodes; unwritten
    memory is NaN, so reading anything the block table does not point at fails."""
    spec = SPECS[kind]
    window = window_for_spec(spec)
    mla = kind.startswith("mla")
    memory = allocate_kv_cache(layer_outer_config([(spec, ["L"])], 24, layout=layout), device)
    view = memory["L"]
    view.tensor.fill_(float("nan"))
    gen = torch.Generator().manual_seed(1)
    lengths = [14, 9]
    tables = [[5, 17, 2, 11], [20, 3, 8]]
    shape = (spec.head_size,) if mla else (spec.num_kv_heads, spec.head_size)
    keys = [torch.randn(n, *shape, generator=gen) for n in lengths]
    values = [torch.randn(n, *shape, generator=gen) for n in lengths]
    done = [0, 0]
    for chunk in (6, 3, 1, 1, 1, 1, 1, 1, 1):
        reqs = []
        for r, n in enumerate(lengths):
            new = min(chunk, n - done[r])
            reqs.append(ScheduledRequest([tables[r]], done[r], new))
        (meta,) = build_attention_metadata(reqs, [spec.block_size], device)
        new_k = torch.cat([keys[r][q.num_computed_tokens : q.seq_len] for r, q in enumerate(reqs)])
        new_v = torch.cat(
            [values[r][q.num_computed_tokens : q.seq_len] for r, q in enumerate(reqs)]
        )
        write_kv(view, meta.slot_mapping, new_k.to(device), None if mla else new_v.to(device))
        # Blocks wholly before every query's window may be dropped: point them at null.
        for r, q in enumerate(reqs):
            if q.num_new_tokens:
                first = int(window.key_start(torch.tensor([q.num_computed_tokens]))[0])
                meta.block_table[r, : first // spec.block_size] = 0
        heads = 4
        query = torch.randn(len(meta.positions), heads, spec.head_size, generator=gen)
        v_size = 5 if mla else None
        got = paged_attention(
            view, query.to(device), meta, value_head_size=v_size, compute_dtype=torch.float64
        )
        expected = []
        starts = meta.query_start_loc.tolist()
        for r, q in enumerate(reqs):
            k_all = keys[r][: q.seq_len].double()
            v_all = k_all[..., :v_size] if mla else values[r][: q.seq_len].double()
            if mla:
                k_all, v_all = k_all[:, None], v_all[:, None]
            pos = torch.arange(q.num_computed_tokens, q.seq_len)
            q_r = query[starts[r] : starts[r + 1]].double()
            expected.append(attend(q_r, k_all, v_all, pos, torch.arange(q.seq_len), window))
        torch.testing.assert_close(got.cpu(), torch.cat(expected), rtol=1e-6, atol=1e-6)
        done = [q.seq_len for q in reqs]
    assert done == lengths


def test_write_kv_needs_values_for_kv_layers() -> None:
    memory = allocate_kv_cache(layer_outer_config([(SPECS["full"], ["L"])], 4))
    with pytest.raises(Exception, match="K and V"):
        write_kv(memory["L"], torch.tensor([0]), torch.zeros(1, 2, 8))
