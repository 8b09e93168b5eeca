"""End to end on loopback: three `pagedkv serve --tiny` engines behind `pagedkv route serve`.

Chats with shared system prompts go through the router and straight to an engine; the
answers must be equal, the balanced router must hit more of the engines' prefix caches
than round robin, a killed engine must leave the routing (its requests served by the
others) and come back when restarted, and every /metrics page must parse.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("zmq")
pytest.importorskip("uvicorn")

from prometheus_client.parser import text_string_to_metric_families
from tests.serve.live import HTTP, START_TIMEOUT_S, Engine, Router, free_ports, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(2400)]

NUM_SYSTEMS = 4
NUM_USERS = 25  # per system prompt: 100 chats, sent alone, through round robin, balanced
MAX_TOKENS = 4
WORKERS = 6


def system_prompt(tag: str, i: int) -> str:
    return f"[{tag}:{i}] You are assistant number {i}. Answer briefly and politely. " * 3


def chat_body(tag: str, system: int, user: int) -> dict[str, Any]:
    messages = [
        {"role": "system", "content": system_prompt(tag, system)},
        {"role": "user", "content": f"question {user}?"},
    ]
    return {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS}


def metric_sums(url: str) -> dict[str, float]:
    text = HTTP.get(f"{url}/metrics", timeout=5).text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def answer(url: str, body: dict[str, Any]) -> str:
    reply = HTTP.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def run_workload(url: str, tag: str) -> dict[tuple[int, int], str]:
    """The first turn of each system prompt one by one, then the rest concurrently."""
    bodies = {(s, u): chat_body(tag, s, u) for s in range(NUM_SYSTEMS) for u in range(NUM_USERS)}
    out = {(s, 0): answer(url, bodies[(s, 0)]) for s in range(NUM_SYSTEMS)}
    rest = [k for k in bodies if k[1] > 0]
    with ThreadPoolExecutor(WORKERS) as pool:
        for key, text in zip(rest, pool.map(lambda k: answer(url, bodies[k]), rest)):
            out[key] = text
    return out


def total(engines: list[Engine], name: str) -> float:
    return sum(metric_sums(e.url)[name] for e in engines)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Engine]]:
    logs: Path = tmp_path_factory.mktemp("live")
    ports = free_ports(9)
    engines = [
        Engine(f"e{i}", ports[3 * i], ports[3 * i + 1], ports[3 * i + 2], logs / f"e{i}.log")
        for i in range(3)
    ]
    try:
        for e in engines:
            e.start()
        for e in engines:
            wait_until(e.ready, START_TIMEOUT_S, f"{e.name} answers /health")
        yield engines
    finally:
        for e in engines:
            e.kill()


def start_router(engines: list[Engine], router: str, log: Path) -> Router:
    (port,) = free_ports(1)
    r = Router(port, engines, log, router=router)
    r.start()
    wait_until(
        lambda: (
            all(v["healthy"] for v in r.health()["engines"].values())
            and r.health()["status"] == "ok"
        ),
        START_TIMEOUT_S,
        "the router sees every engine",
    )
    return r


def reset_caches(engines: list[Engine]) -> None:
    for e in engines:
        assert HTTP.post(f"{e.url}/reset_prefix_cache", timeout=30).status_code == 200


def test_router_end_to_end(fleet: list[Engine], tmp_path: Path) -> None:
    engines = fleet
    # what one engine alone answers (every engine has the same seeded weights)
    alone = run_workload(engines[0].url, "chat")

    hits: dict[str, float] = {}
    for policy in ("round-robin", "balanced"):
        reset_caches(engines)  # each pass starts cold
        router = start_router(engines, policy, tmp_path / f"router-{policy}.log")
        before = total(engines, "vllm:prefix_cache_hits_total")
        routed = run_workload(router.url, "chat")
        hits[policy] = total(engines, "vllm:prefix_cache_hits_total") - before
        assert routed == alone
        text = HTTP.get(f"{router.url}/metrics", timeout=5).text
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"pagedkv_route_requests", "pagedkv_engine_up", "pagedkv_feed_batches"} <= names
        if policy == "round-robin":
            router.stop()
    print(f"\nlive: {len(alone)} chats per pass, prefix-cache hit tokens {hits}", flush=True)
    assert hits["balanced"] > hits["round-robin"], hits

    try:
        victim = engines[2]
        victim.kill()
        served_before = total(engines[:2], "vllm:request_success_total")
        bodies = [chat_body("down", s, 0) for s in range(12)]
        with ThreadPoolExecutor(WORKERS) as pool:
            texts = list(pool.map(lambda b: answer(router.url, b), bodies))
        assert texts == [answer(engines[0].url, b) for b in bodies]
        # the 12 routed requests (and the 12 references) all ran on the two live engines
        assert total(engines[:2], "vllm:request_success_total") - served_before == 24
        wait_until(lambda: not router.health()["engines"]["e2"]["healthy"], 30, "e2 taken out")

        victim.start()
        wait_until(victim.ready, START_TIMEOUT_S, "e2 restarted")
        wait_until(lambda: router.health()["engines"]["e2"]["healthy"], 30, "e2 back in")
        for s in range(12):
            answer(router.url, chat_body("back", s, 0))
        assert metric_sums(victim.url)["vllm:request_success_total"] > 0
        # the restarted engine's blocks are indexed again from its new stream
        wait_until(lambda: router.health()["engines"]["e2"]["batches"] > 0, 30, "e2 events")
    finally:
        router.stop()
