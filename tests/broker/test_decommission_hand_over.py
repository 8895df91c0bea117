"""Decommission of the broker that leads the controller quorum (issue 26): the decommissioning
broker asks it (``HandOverControllerRequest``) to hand the lead over, then waits until its own
view names another leader; every way that can fail is a retriable ``TIMEOUT`` that says why.
``REMOVEBROKER`` sent to the leaving broker itself is carried out by another
(``DecommissionRequest``): which one, and what comes back.
Run on trio's mock clock with a real ``Forwarder`` whose peer is played by the test; the real
hand-over on real processes is in ``test_decommission``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, cast

import pytest
import trio
import trio.testing

from kafkaesque.broker._decommission import (
    HAND_OVER_TIMEOUT_S,
    delegate_decommission,
    hand_controller_over,
)
from kafkaesque.broker._errors import RequestError
from kafkaesque.broker._forwarding import Forwarder
from kafkaesque.broker._metadata import ClusterMetadata
from kafkaesque.broker._metadata_view import BrokerInfo, MetadataView
from kafkaesque.protocol import (
    Answer,
    ControllerHandOver,
    Decommissioned,
    DecommissionRequest,
    ErrorCode,
    HandOverControllerRequest,
    PeerCall,
    Refused,
    Retry,
    peer_from_wire,
)

LEAVING = 3


@dataclass
class _Metadata:
    """What ``hand_controller_over`` reads of ``ClusterMetadata``: its view."""

    view: MetadataView = field(default_factory=lambda: MetadataView(1, {}, {}, LEAVING))

    def lead(self, broker: int | None) -> None:
        self.view = replace(self.view, controller_leader=broker)


class _Peer:
    """The leaving broker: answers each request with ``answer(request)`` after ``delay``
    seconds (None: never), and may change the decommissioning broker's view meanwhile."""

    def __init__(
        self,
        nursery: trio.Nursery,
        answer: Callable[[HandOverControllerRequest], Answer | None],
        *,
        connected: bool = True,
        delay: float = 0.05,
        then: Callable[[], None] = lambda: None,
    ) -> None:
        self.nursery = nursery
        self.answer = answer
        self.connected = connected
        self.delay = delay
        self.then = then
        self.asked: list[tuple[int, HandOverControllerRequest]] = []
        self.forwarder = Forwarder(self.send)

    def send(self, peer: int, item: Any) -> bool:
        if not self.connected:
            return False
        msg = peer_from_wire(item)
        assert isinstance(msg, PeerCall) and isinstance(msg.request, HandOverControllerRequest)
        self.asked.append((peer, msg.request))
        self.nursery.start_soon(self._reply, msg.req, msg.request)
        return True

    async def _reply(self, req: int, request: HandOverControllerRequest) -> None:
        await trio.sleep(self.delay)
        answer = self.answer(request)
        self.then()
        if answer is not None:
            self.forwarder.answered(req, answer)


async def _hand_over(metadata: _Metadata, peer: _Peer) -> None:
    await hand_controller_over(cast(ClusterMetadata, metadata), peer.forwarder, LEAVING)


async def test_the_leaving_leader_is_asked_and_the_call_returns_once_another_leads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metadata = _Metadata()
    async with trio.open_nursery() as nursery:
        peer = _Peer(
            nursery, lambda _: ControllerHandOver(True, 1), then=lambda: metadata.lead(None)
        )

        async def elected() -> None:  # the news reaches this replica a moment after the answer
            await trio.sleep(0.3)
            metadata.lead(1)

        nursery.start_soon(elected)
        await _hand_over(metadata, peer)
    assert peer.asked == [(LEAVING, HandOverControllerRequest(HAND_OVER_TIMEOUT_S))]
    assert metadata.view.controller_leader == 1


async def _refusal(metadata: _Metadata, peer: _Peer) -> RequestError:
    with pytest.raises(RequestError) as refused:
        await _hand_over(metadata, peer)
    assert refused.value.code is ErrorCode.TIMEOUT and refused.value.code.retriable
    assert f"send REMOVEBROKER {LEAVING} again" in refused.value.message
    return refused.value


async def test_no_up_to_date_controller_to_take_the_lead_is_a_retriable_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        peer = _Peer(nursery, lambda _: ControllerHandOver(False, LEAVING), delay=5.0)
        error = await _refusal(_Metadata(), peer)
    assert "could not hand it over within 5 s: no other controller was connected and up to " in (
        error.message
    )


async def test_a_leaving_broker_that_does_not_answer_is_a_retriable_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        silent = _Peer(nursery, lambda _: None)
        started = trio.current_time()
        error = await _refusal(_Metadata(), silent)
        assert trio.current_time() - started < HAND_OVER_TIMEOUT_S + 5  # bounded
        assert "did not answer the request to hand it over" in error.message
        gone = _Peer(nursery, lambda _: None, connected=False)
        error = await _refusal(_Metadata(), gone)
        assert "not connected" in error.message and not gone.asked


async def test_a_hand_over_this_replica_does_not_see_is_a_retriable_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        # It says another leads, but this replica's view still names it (or nobody) at the end.
        peer = _Peer(nursery, lambda _: ControllerHandOver(True, 1))
        error = await _refusal(_Metadata(), peer)
        assert f"sees broker {LEAVING} still leading" in error.message
        metadata = _Metadata()
        peer = _Peer(
            nursery, lambda _: ControllerHandOver(True, 1), then=lambda: metadata.lead(None)
        )
        error = await _refusal(metadata, peer)
        assert "sees no controller leader" in error.message


async def test_an_answer_of_another_kind_is_an_internal_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        peer = _Peer(nursery, lambda _: Retry("what?"))
        with pytest.raises(RequestError) as refused:
            await _hand_over(_Metadata(), peer)
    assert refused.value.code is ErrorCode.INTERNAL


# -- REMOVEBROKER sent to the leaving broker itself ----------------------------------------------


def _registry(*ids: int, leader: int | None = None) -> _Metadata:
    brokers = {b: BrokerInfo(b, "127.0.0.1", 1, 2, 3) for b in ids}
    return _Metadata(MetadataView(1, brokers, {}, leader))


class _Carrier:
    """The other brokers: each answers a ``DecommissionRequest`` with ``answers[broker]`` (a
    broker absent from it is not connected: the send fails)."""

    def __init__(self, nursery: trio.Nursery, answers: dict[int, Answer]) -> None:
        self.nursery = nursery
        self.answers = answers
        self.asked: list[tuple[int, DecommissionRequest]] = []
        self.forwarder = Forwarder(self.send)

    def send(self, peer: int, item: Any) -> bool:
        if peer not in self.answers:
            return False
        msg = peer_from_wire(item)
        assert isinstance(msg, PeerCall) and isinstance(msg.request, DecommissionRequest)
        self.asked.append((peer, msg.request))
        self.nursery.start_soon(self._reply, peer, msg.req)
        return True

    async def _reply(self, peer: int, req: int) -> None:
        await trio.sleep(0.05)
        self.forwarder.answered(req, self.answers[peer])


async def _delegate(metadata: _Metadata, carrier: _Carrier, connected: set[int]) -> int:
    return await delegate_decommission(
        cast(ClusterMetadata, metadata), carrier.forwarder, LEAVING, connected
    )


async def test_the_controller_leaders_broker_carries_it_out_and_its_answer_comes_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        carrier = _Carrier(nursery, {0: Decommissioned(4), 2: Decommissioned(5)})
        moved = await _delegate(_registry(0, 1, 2, LEAVING, leader=2), carrier, {0, 1, 2})
        assert moved == 5 and carrier.asked == [(2, DecommissionRequest(LEAVING))]
        # The leader's broker not connected (nor is broker 1, though it says so): the next one.
        carrier = _Carrier(nursery, {0: Decommissioned(4)})
        assert await _delegate(_registry(0, 1, 2, LEAVING, leader=2), carrier, {0, 1}) == 4
        assert carrier.asked == [(0, DecommissionRequest(LEAVING))]
        # Its refusal is the answer, with its code.
        refusal = Refused(ErrorCode.INVALID_CONFIG, "below its replication factor")
        carrier = _Carrier(nursery, {0: refusal})
        with pytest.raises(RequestError) as refused:
            await _delegate(_registry(0, LEAVING, leader=LEAVING), carrier, {0})
        assert (refused.value.code, refused.value.message) == (refusal.code, refusal.message)


async def test_with_nobody_to_carry_it_out_it_is_refused_saying_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        carrier = _Carrier(nursery, {})
        with pytest.raises(RequestError) as refused:
            await _delegate(_registry(0, 1, LEAVING), carrier, set())
        assert refused.value.code is ErrorCode.NO_QUORUM and refused.value.code.retriable
        assert "none of 0, 1 is connected" in refused.value.message
        with pytest.raises(RequestError) as refused:
            await _delegate(_registry(LEAVING), carrier, set())
        assert refused.value.code is ErrorCode.INVALID_CONFIG
        assert "the only registered broker" in refused.value.message
        with pytest.raises(RequestError) as refused:
            await _delegate(_registry(0, 1), carrier, {0, 1})
        assert refused.value.code is ErrorCode.INVALID_CONFIG
        assert f"no broker {LEAVING} is registered" in refused.value.message
        assert carrier.asked == []
