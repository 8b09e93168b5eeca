"""Traces: what a simulation replays. ``trace`` defines a request as segments of token
streams; ``readers`` and ``token_records`` parse Mooncake, Azure and token-id/text JSONL
files (hash-id block size checked, bad lines named); ``bundled`` finds the traces shipped
in ``pagedkv/data``; ``synthetic`` generates conversations over shared system prompts;
``tokens`` turns segments into deterministic token ids and ``keys`` into chained block
keys without building the tokens."""
