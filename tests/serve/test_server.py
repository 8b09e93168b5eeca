"""``pagedkv serve``'s app in process: OpenAI answers, streams, metrics, guards, events."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("starlette")
pytest.importorskip("zmq")

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient
from tests.serve.helpers import tiny_generator

from pagedkv.cluster.hashing import PromptHasher
from pagedkv.events import EventSubscriber, KVEventsConfig, ZmqEventPublisher
from pagedkv.hf.online import OnlineEngine
from pagedkv.hf.server import ServedModel, create_engine_app
from pagedkv.hf.tokenizer import ChatTokenizer, tiny_tokenizer
from pagedkv.runtime.events import AllBlocksCleared, BlockStored

SYSTEM = "You are a careful assistant who answers in one short sentence. " * 2


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[TestClient, ServedModel, EventSubscriber]]:
    import torch

    torch.set_num_threads(1)
    config = KVEventsConfig(
        endpoint="tcp://127.0.0.1:0", replay_endpoint="tcp://127.0.0.1:0", buffer_steps=1000
    )
    publisher = ZmqEventPublisher(config, bind=True)
    subscriber = EventSubscriber(publisher.endpoint, publisher.replay_endpoint)
    engine = OnlineEngine(tiny_generator(), publish=publisher.publish).start()
    model = ServedModel(engine, ChatTokenizer(tiny_tokenizer()), "tiny", max_body_bytes=4096,
                        api_keys=("sekret",))  # fmt: skip
    with TestClient(create_engine_app(model)) as client:
        client.headers["Authorization"] = "Bearer sekret"
        yield client, model, subscriber
    engine.stop()
    subscriber.close()
    publisher.close()


def chat(system: str, user: str, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return {"model": "tiny", "messages": messages, "max_tokens": 6, **extra}


def sse_events(text: str) -> list[Any]:
    lines = [line[len("data: ") :] for line in text.split("\n\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_completion_and_chat_answers(served) -> None:
    client, _, _ = served
    r = client.post("/v1/completions", json={"prompt": "hello paged world", "max_tokens": 5})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["usage"] == {"prompt_tokens": 17, "completion_tokens": 5, "total_tokens": 22}
    assert body["choices"][0]["finish_reason"] == "length"
    r = client.post("/v1/chat/completions", json=chat(SYSTEM, "hi"))
    assert r.status_code == 200, r.text
    message = r.json()["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)


def test_stream_carries_the_same_text(served) -> None:
    client, _, _ = served
    whole = client.post("/v1/chat/completions", json=chat(SYSTEM, "stream me"))
    stream = client.post("/v1/chat/completions", json=chat(SYSTEM, "stream me", stream=True))
    assert stream.headers["content-type"].startswith("text/event-stream")
    events = sse_events(stream.text)
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == whole.json()["choices"][0]["message"]["content"]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    plain = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4})
    streamed = client.post(
        "/v1/completions", json={"prompt": "abc", "max_tokens": 4, "stream": True}
    )
    text = "".join(e["choices"][0]["text"] for e in sse_events(streamed.text))
    assert text == plain.json()["choices"][0]["text"]


def metrics(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def test_metrics_use_vllm_names_and_count_prefix_hits(served) -> None:
    client, _, _ = served
    before = metrics(client)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
    ):
        assert name in before
    for _ in range(2):
        assert (
            client.post("/v1/chat/completions", json=chat(SYSTEM, "same again")).status_code == 200
        )
    after = metrics(client)
    prompt_len = len(
        ChatTokenizer(tiny_tokenizer()).chat_ids(chat(SYSTEM, "same again")["messages"])
    )
    # the second request finds at least every full block of the first's prompt cached
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] >= (
        (prompt_len - 1) // 16 * 16
    )
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == 2 * prompt_len
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 12
    assert after["vllm:num_requests_running"] == 0


def test_events_carry_the_hashes_a_router_computes(served) -> None:
    client, model, subscriber = served
    assert client.post("/v1/chat/completions", json=chat(SYSTEM, "events")).status_code == 200
    stored: set[Any] = set()
    for _ in range(50):
        for delivery in subscriber.poll(0.1):
            for event in delivery.batch.events:
                if isinstance(event, BlockStored):
                    stored.update(event.block_hashes)
        ids = model.tokenizer.chat_ids(chat(SYSTEM, "events")["messages"])
        wanted = PromptHasher(16)(ids)
        if wanted and set(wanted) <= stored:
            break
    assert wanted and set(wanted) <= stored


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"[" * 5000 + b"]" * 5000, 413),
        (b"[" * 2000 + b"]" * 2000, 400),
        (b'{"prompt": "x", "max_tokens": NaN}', 400),
        (b'{"prompt": "x", "max_tokens": 0}', 400),
        (b'{"prompt": [1, 99999], "max_tokens": 2}', 400),
        (b'{"prompt": {"a": 1}}', 400),
        (b"not json", 400),
    ],
)
def test_bad_requests_are_4xx_never_500(served, body: bytes, status: int) -> None:
    client, _, _ = served
    r = client.post("/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert "message" in r.json()["error"]


def test_api_key_guards_v1_only(served) -> None:
    client, _, _ = served
    body = {"prompt": "x", "max_tokens": 1}
    assert (
        client.post(
            "/v1/completions", json=body, headers={"Authorization": "Bearer no"}
        ).status_code
        == 401
    )
    assert (
        client.post("/v1/completions", json=body, headers={"Authorization": ""}).status_code == 401
    )
    assert client.get("/health", headers={"Authorization": ""}).status_code == 200


def test_reset_prefix_cache_forgets_blocks_and_says_so_in_events(served) -> None:
    client, _, subscriber = served
    body = chat(SYSTEM, "reset me")
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert client.post("/reset_prefix_cache").status_code == 200
    before = metrics(client)["vllm:prefix_cache_hits_total"]
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert metrics(client)["vllm:prefix_cache_hits_total"] == before
    cleared = False
    for _ in range(50):
        for delivery in subscriber.poll(0.1):
            cleared |= any(isinstance(e, AllBlocksCleared) for e in delivery.batch.events)
        if cleared:
            break
    assert cleared
    assert client.post("/reset_prefix_cache", headers={"Authorization": ""}).status_code == 401
