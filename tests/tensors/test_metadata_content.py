"""Invariants of slot mappings, block tables and the prefix-determined K/V content."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pagedkv.tensors import ScheduledRequest, build_attention_metadata  # noqa: E402
from pagedkv.tensors.content import TokenContent, chain_seeds  # noqa: E402


@st.composite
def steps(draw: st.DrawFn) -> tuple[list[ScheduledRequest], list[int]]:
    block_sizes = draw(st.lists(st.sampled_from([1, 2, 4, 16]), min_size=1, max_size=3))
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        computed = draw(st.integers(0, 40))
        new = draw(st.integers(0, 20))
        total = computed + new
        ids = [
            draw(
                st.lists(
                    st.integers(0, 500), min_size=-(-total // bs), max_size=-(-total // bs) + 2
                )
            )
            for bs in block_sizes
        ]
        requests.append(ScheduledRequest(ids, computed, new))
    return requests, block_sizes


@settings(max_examples=60, deadline=None)
@given(step=steps())
@pytest.mark.slow
def test_every_slot_is_its_tokens_block_and_offset(step) -> None:
    requests, block_sizes = step
    metadata = build_attention_metadata(requests, block_sizes)
    for gid, (meta, bs) in enumerate(zip(metadata, block_sizes)):
        assert meta.block_size == bs
        starts = meta.query_start_loc.tolist()
        assert starts[0] == 0 and starts[-1] == len(meta.slot_mapping) == len(meta.positions)
        for i, request in enumerate(requests):
            rows = range(starts[i], starts[i + 1])
            assert len(rows) == request.num_new_tokens
            assert meta.seq_lens[i] == request.seq_len
            table = meta.block_table[i].tolist()
            assert table[: len(request.block_ids[gid])] == list(request.block_ids[gid])
            for row in rows:
                pos, slot = int(meta.positions[row]), int(meta.slot_mapping[row])
                assert request.num_computed_tokens <= pos < request.seq_len
                assert divmod(slot, bs) == (table[pos // bs], pos % bs)


def test_content_is_a_function_of_the_token_prefix() -> None:
    content = TokenContent({"L": ((2, 3), (2, 3))}, {"L": torch.float16})
    a = [5, 6, 7, 8, 9]
    b = [5, 6, 7, 1, 9]
    k_a, v_a = content.layer_rows("a", a, "L", 0, 5)
    k_b, _ = content.layer_rows("b", b, "L", 0, 5)
    assert k_a.shape == (5, 2, 3) and k_a.dtype == torch.float64
    assert torch.equal(k_a[:3], k_b[:3])  # shared prefix, same K
    assert not torch.equal(k_a[3:], k_b[3:])  # a different token changes all later K
    assert not torch.equal(k_a, v_a)
    assert torch.equal(k_a, k_a.half().double())  # exactly representable in the cache dtype
    again = TokenContent({"L": ((2, 3), (2, 3))}, {"L": torch.float16})
    assert torch.equal(again.layer_rows("x", a, "L", 2, 4)[0], k_a[2:4])  # any order, any key
    assert chain_seeds([1, 2], 0, []) == chain_seeds([1, 2], 0, chain_seeds([1], 0, []))
    assert chain_seeds([1, 2], 0, []) != chain_seeds([1, 2], 1, [])


def test_each_layer_reads_its_own_parts_of_a_token() -> None:
    shapes = {"kv": ((2, 3), (2, 3)), "latent": ((4,),), "kv2": ((1, 2), (1, 2))}
    dtypes = dict.fromkeys(shapes, torch.float64)
    content = TokenContent(shapes, dtypes)
    tokens = [3, 1, 4]
    parts = content.rows("r", tokens, 3)  # per token: kv K, kv V, latent, kv2 K, kv2 V
    expected = {"kv": (0, 1), "latent": (2,), "kv2": (3, 4)}
    for layer, indexes in expected.items():
        got = content.layer_rows("r", tokens, layer, 1, 3)
        assert len(got) == len(indexes)
        for tensor, index, shape in zip(got, indexes, shapes[layer], strict=True):
            want = torch.stack([parts[t][index].view(shape) for t in (1, 2)])
            assert torch.equal(tensor, want)
