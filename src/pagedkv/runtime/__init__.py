"""Run time: block hashing, the block pool, per-kind managers, coordinators, KVCacheManager."""
