"""The scheduler loop: how a simulated replica drives its ``KVCacheManager`` step by step,
as vLLM 0.33's v1 ``Scheduler`` does. ``scheduler`` holds the settings and one step's
decisions (running requests first, preemption, admission with prefix-cache lookups);
``chunking`` the prefill chunk split (Mamba-aligned where vLLM aligns it); ``loop`` one
replica's engine loop over arrivals on the simulated clock, one step at a time; and
``simulator`` a replica that replays whole traces with it."""
