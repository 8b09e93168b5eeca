"""vLLM's ``vllm.utils.hashing``: pagedkv's block hash functions (byte-identical)."""

from pagedkv.runtime.hashing import sha256, sha256_cbor, xxhash, xxhash_cbor

__all__ = ["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"]
