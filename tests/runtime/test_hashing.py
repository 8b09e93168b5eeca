"""Chained block hashes, extra keys and the hash functions."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pagedkv.errors import ConfigError
from pagedkv.runtime import BlockHasher, MultiModalFeature, Request, get_hash_fn, hash_token_blocks
from pagedkv.runtime.hashing import (
    HASH_FUNCTIONS,
    BlockHash,
    block_extra_keys,
    prompt_embeds_digest,
    sha256_cbor,
)


def hashes(tokens: list[int], block_size: int = 4, algo: str = "sha256_cbor", **kw: object) -> list:
    return Request("r", tokens, hasher=BlockHasher(block_size, algo), **kw).block_hashes  # type: ignore[arg-type]


@pytest.mark.parametrize("algo", ["sha256_cbor", "xxhash128", "builtin"])
def test_only_full_blocks_are_hashed_and_chain_covers_the_prefix(algo: str) -> None:
    assert len(hashes(list(range(11)), algo=algo)) == 2
    a = hashes([1, 2, 3, 4, 5, 6, 7, 8], algo=algo)
    b = hashes([9, 2, 3, 4, 5, 6, 7, 8], algo=algo)
    assert a[1] != b[1]  # same second block, different prefix
    assert hash_token_blocks([1, 2, 3, 4, 5, 6, 7, 8], 4, algo) == a


def test_hashes_are_computed_incrementally_as_tokens_arrive() -> None:
    hasher = BlockHasher(4)
    req = Request("r", [1, 2, 3], hasher=hasher)
    assert req.block_hashes == []
    req.append_output_token_ids(4)
    assert len(req.block_hashes) == 1
    first = req.block_hashes[0]
    req.append_output_token_ids([5, 6, 7, 8, 9])
    assert req.block_hashes[0] is first and len(req.block_hashes) == 2
    assert req.block_hashes == hash_token_blocks(list(range(1, 10)), 4)


def _child_hash(algo: str, env: dict[str, str]) -> str:
    code = (
        "from pagedkv.runtime import hash_token_blocks;"
        f"print(hash_token_blocks(list(range(8)), 4, {algo!r})[1].hex())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return out.stdout.strip()


@pytest.mark.slow
def test_none_hash_follows_vllms_seed_rule() -> None:
    import os

    base = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    fixed = BlockHasher(4, "sha256_cbor", seed="vllm-none-hash")
    expected = Request("r", list(range(8)), hasher=fixed).block_hashes[1].hex()
    # Cryptographic: the fixed seed without PYTHONHASHSEED, identical across processes.
    assert _child_hash("sha256_cbor", base) == _child_hash("sha256_cbor", base) == expected
    # PYTHONHASHSEED, when set, is the seed.
    seeded = BlockHasher(4, "sha256_cbor", seed="123")
    with_seed = Request("r", list(range(8)), hasher=seeded).block_hashes[1].hex()
    assert _child_hash("sha256_cbor", {**base, "PYTHONHASHSEED": "123"}) == with_seed
    # xxhash without PYTHONHASHSEED: a random seed per process.
    assert _child_hash("xxhash", base) != _child_hash("xxhash", base)


def test_sha256_cbor_is_sha256_of_canonical_cbor() -> None:
    import hashlib

    import cbor2

    obj = (b"x", (1, 2), None)
    assert sha256_cbor(obj) == hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()
    assert len(sha256_cbor(obj)) == 32
    assert len(get_hash_fn("xxhash128")(obj)) == 16


def test_unknown_hash_algo_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="md5"):
        get_hash_fn("md5")


def test_cache_salt_changes_only_the_first_blocks_own_key() -> None:
    req = Request("r", list(range(8)), cache_salt="s")
    assert block_extra_keys(req, 0, 4, 0)[0] == (("cache_salt", "s"),)
    assert block_extra_keys(req, 4, 8, 0)[0] is None
    plain = hashes(list(range(8)))
    salted = hashes(list(range(8)), cache_salt="s")
    assert plain[0] != salted[0] and plain[1] != salted[1]  # via the chain


def test_lora_name_and_path_are_a_key_of_every_block() -> None:
    from pagedkv.runtime import LoRA

    req = Request("r", list(range(8)), lora=LoRA("adapter", 3, "/w/a"), cache_salt="s")
    assert block_extra_keys(req, 4, 8, 0)[0] == (("lora", "adapter", "/w/a"),)
    assert block_extra_keys(req, 0, 4, 0)[0] == (("lora", "adapter", "/w/a"), ("cache_salt", "s"))
    same_name = Request("q", list(range(8)), lora=LoRA("adapter", 3, "/w/b"), hasher=BlockHasher(4))
    req.set_hasher(BlockHasher(4))
    assert same_name.block_hashes[0] != req.block_hashes[0]  # other weights, other blocks
    assert Request("n", [1], lora_name="x").lora == LoRA("x")
    assert hashes(list(range(8)), lora_name="a") != hashes(list(range(8)), lora_name="b")


def test_multimodal_offsets_are_relative_to_the_block_start() -> None:
    feature = MultiModalFeature("img0", offset=2, length=5)  # tokens [2, 7)
    req = Request("r", list(range(12)), mm_features=[feature])
    assert block_extra_keys(req, 0, 4, 0)[0] == (("mm", "img0", 2),)
    assert block_extra_keys(req, 4, 8, 0)[0] == (("mm", "img0", -2),)
    assert block_extra_keys(req, 8, 12, 0)[0] is None
    other = MultiModalFeature("img1", offset=2, length=5)
    assert hashes(list(range(12)), mm_features=[feature]) != hashes(
        list(range(12)), mm_features=[other]
    )


def test_next_multimodal_index_is_past_the_items_a_block_finishes() -> None:
    features = [MultiModalFeature("a", 0, 5), MultiModalFeature("b", 10, 5)]
    req = Request("r", list(range(20)), mm_features=features)
    assert block_extra_keys(req, 0, 5, 0) == ((("mm", "a", 0),), 1)
    assert block_extra_keys(req, 3, 8, 0) == ((("mm", "a", -3),), 1)
    assert block_extra_keys(req, 6, 10, 0) == (None, 1)  # "a" ended before, "b" not begun
    assert block_extra_keys(req, 8, 12, 1) == ((("mm", "b", 2),), 1)  # "b" goes on
    assert block_extra_keys(req, 0, 15, 0) == ((("mm", "a", 0), ("mm", "b", 10)), 2)
    assert block_extra_keys(req, 16, 20, 1) == (None, 1)  # past every item: index kept


def test_set_lora_keys_the_blocks_hashed_afterwards() -> None:
    from pagedkv.runtime import LoRA

    req = Request("r", list(range(8)))
    req.set_lora(LoRA("adapter", 1, "/w/a"))
    assert not req.plain
    assert block_extra_keys(req, 0, 4, 0)[0] == (("lora", "adapter", "/w/a"),)
    req.set_lora(None)
    assert req.plain and block_extra_keys(req, 0, 4, 0)[0] is None


def test_prompt_embeds_digest_reads_bytes_through_the_given_reader() -> None:
    import hashlib

    np = pytest.importorskip("numpy")
    embeds = np.arange(6, dtype=np.float32).reshape(2, 3)
    seen: list[object] = []

    def reader(tensor: object) -> bytes:
        seen.append(tensor)
        return b"fixed"

    assert prompt_embeds_digest(embeds) == hashlib.sha256(embeds.tobytes()).digest()
    assert prompt_embeds_digest(embeds, reader) == hashlib.sha256(b"fixed").digest()
    assert len(seen) == 1
    req = Request("r", [0, 1], prompt_embeds=embeds)
    keys, _ = block_extra_keys(req, 0, 2, 0, embeds_digest=lambda e: b"key")
    assert keys == (("prompt_embeds", b"key"),)


def test_empty_prompt_is_rejected() -> None:
    from pagedkv.errors import KVCacheRuntimeError

    with pytest.raises(KVCacheRuntimeError, match="empty"):
        Request("r", [])


def test_chain_seed_changes_every_hash_and_is_deterministic() -> None:
    a = BlockHasher(4, seed="one")
    b = BlockHasher(4, seed="two")
    tokens = list(range(8))
    assert (
        Request("r", tokens, hasher=a).block_hashes != Request("r", tokens, hasher=b).block_hashes
    )
    assert Request("r", tokens, hasher=a).block_hashes == (
        Request("s", tokens, hasher=BlockHasher(4, seed="one")).block_hashes
    )


def test_manager_rehashes_a_request_hashed_elsewhere_with_the_same_settings() -> None:
    from .helpers import full, make_manager

    manager = make_manager([full()], hash_seed="mine")
    req = Request("r", list(range(8)), hasher=BlockHasher(4, seed="other"))
    before = list(req.block_hashes)
    manager.get_computed_blocks(req)
    assert req.hasher is manager.hasher and req.block_hashes != before


def test_manager_rejects_a_request_hashed_at_another_block_size() -> None:
    from pagedkv.errors import KVCacheRuntimeError

    from .helpers import full, make_manager

    manager = make_manager([full()])
    req = Request("r", list(range(8)), hasher=BlockHasher(8))
    with pytest.raises(KVCacheRuntimeError, match="block size 8"):
        manager.get_computed_blocks(req)


def test_every_algorithm_is_vllms_definition() -> None:
    import hashlib
    import pickle

    import cbor2
    import xxhash as xx

    obj = (b"\x01" * 32, (1, 2, 3), (("lora", "a", "/p"), ("cache_salt", "s")))
    pickled = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    cbor = cbor2.dumps(obj, canonical=True)
    assert get_hash_fn("sha256")(obj) == hashlib.sha256(pickled).digest()
    assert get_hash_fn("sha256_cbor")(obj) == hashlib.sha256(cbor).digest()
    assert get_hash_fn("xxhash")(obj) == xx.xxh3_128_digest(pickled)
    assert get_hash_fn("xxhash_cbor")(obj) == get_hash_fn("xxhash128")(obj)
    assert get_hash_fn("xxhash_cbor")(obj) == xx.xxh3_128_digest(cbor)
    with pytest.raises(ConfigError, match="unknown hash_algo"):
        get_hash_fn("md5")


def test_prompt_embeddings_and_an_empty_salt_follow_vllms_keys() -> None:
    import hashlib

    np = pytest.importorskip("numpy")
    embeds = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    req = Request("r", list(range(8)), prompt_embeds=embeds, cache_salt="")
    digest = hashlib.sha256(embeds[4:8].tobytes()).digest()
    assert block_extra_keys(req, 4, 8, 0)[0] == (("prompt_embeds", digest),)
    assert block_extra_keys(Request("s", [1], cache_salt=""), 0, 4, 0)[0] is None


@pytest.mark.parametrize("algo", sorted(HASH_FUNCTIONS))
def test_every_algorithm_gives_block_hashes(algo: str) -> None:
    # BlockHash (bytes | int) is what the pool keys by: every algorithm's hashes are one.
    chained = hash_token_blocks(list(range(8)), 4, algo)
    assert len(chained) == 2
    assert all(isinstance(h, BlockHash) for h in chained)
    expected = int if algo == "builtin" else bytes
    assert all(type(h) is expected for h in chained)


def test_block_hash_is_exported_where_users_look() -> None:
    import pagedkv
    import pagedkv.runtime

    assert pagedkv.BlockHash is pagedkv.runtime.BlockHash is BlockHash
    assert "BlockHash" in pagedkv.__all__ and "BlockHash" in pagedkv.runtime.__all__
