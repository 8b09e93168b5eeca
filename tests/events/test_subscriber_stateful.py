"""EventSubscriber's ordering logic under random loss, duplication, reordering of replay
and restarts, against an in-memory publisher (no sockets: a replay request is answered
from a buffer at once)."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule

from pagedkv.events.subscriber import Delivery, EventSubscriber, PendingReplay
from pagedkv.events.wire import encode_payload
from pagedkv.runtime.events import BlockRemoved, BlockStored


class _Memory(EventSubscriber):
    """A subscriber whose socket is never used and whose replay reads ``buffer``."""

    def __init__(self, publisher: PublisherModel) -> None:
        super().__init__("inproc://unused-stateful", "inproc://replay")
        self.publisher = publisher

    def _send_replay_request(self, pending: PendingReplay) -> None:
        pending.replies = [(s, p) for s, p in self.publisher.buffer if s >= pending.ask_from]
        pending.answered = True


class PublisherModel:
    """Numbers batches from 0, keeps the last ``keep`` for replay."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []

    def publish(self, payload: bytes) -> tuple[int, bytes]:
        item = (self.seq, payload)
        self.seq += 1
        self.buffer = [*self.buffer, item][-self.keep :]
        return item


def _stored(h: int) -> BlockStored:
    return BlockStored(
        block_hashes=[h], parent_block_hash=None, token_ids=[], block_size=4,
        lora_id=None, medium="GPU", lora_name=None,
    )  # fmt: skip


class SubscriberMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pub = PublisherModel(keep=6)
        self.sub = _Memory(self.pub)
        self.truth: set[int] = set()  # what the engine holds
        self.seen: set[int] = set()  # what the subscriber rebuilt
        self.sent: list[tuple[int, bytes]] = []
        self.applied: list[tuple[int, bytes]] = []

    def _apply(self, deliveries: list[Delivery]) -> None:
        for d in deliveries:
            self.applied.append(self.sent[d.seq])
            if d.reset:
                self.seen.clear()
            for ev in d.batch.events:
                if isinstance(ev, BlockStored):
                    self.seen.update(ev.block_hashes)
                elif isinstance(ev, BlockRemoved):
                    self.seen.difference_update(ev.block_hashes)

    @rule(h=st.integers(0, 20), store=st.booleans(), deliver=st.booleans())
    def step(self, h: int, store: bool, deliver: bool) -> None:
        if store:
            event = _stored(h)
            self.truth.add(h)
        else:
            event = BlockRemoved(block_hashes=[h], medium="GPU")
            self.truth.discard(h)
        seq, payload = self.pub.publish(encode_payload([event]))
        self.sent.append((seq, payload))
        if deliver:
            self._apply(self.sub.handle([b"", seq.to_bytes(8, "big"), payload]))

    @precondition(lambda self: self.applied)
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        """An applied batch arrives again (live after a tail replay gave it): ignored. (A
        lost batch never arrives late: ZeroMQ drops, it does not delay.)"""
        seq, payload = data.draw(st.sampled_from(self.applied))
        before = self.sub.num_duplicates
        self._apply(self.sub.handle([b"", seq.to_bytes(8, "big"), payload]))
        assert self.sub.num_duplicates == before + 1

    @rule()
    def tail(self) -> None:
        self._apply(self.sub.sync_tail())
        self._check()

    def _check(self) -> None:
        """After a tail sync the subscriber is at the publisher's end; its state is exact
        unless something was lost for good, and then it holds only true blocks."""
        assert self.sub.next_seq == self.pub.seq
        assert self.seen <= self.truth
        if self.sub.num_lost == 0:
            assert self.seen == self.truth

    def teardown(self) -> None:
        self._apply(self.sub.sync_tail())
        if self.pub.seq:
            self._check()
        self.sub.close()


TestSubscriberMachine = SubscriberMachine.TestCase
TestSubscriberMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
