"""A persistent session's deliveries from one log partition, through reconnects, against MQTT.

The pure parts the broker runs (``MqttServerConnection``, ``_resume``, the session record's
codec) are driven here as the broker's MQTT driver drives them, with a spec-abiding client on
the other side; hypothesis interleaves publishing, delivering, sending, the client's
acknowledgements in any order, clean disconnects and lost connections, and reconnects to this
broker or another (whose live reader stands elsewhere in the log). What MQTT promises a
subscriber (3.1.1 §4.3-4.4, 5.0 §4.3-4.4) is checked on every packet and at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kafkaesque.broker.mqtt._resume import CatchUp, Owed, Place, Progress, session_progress
from kafkaesque.broker.mqtt._sessions import StoredSession, decode_session, encode_session
from kafkaesque.protocol.mqtt import (
    Acked,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttProperties,
    MqttServerConnection,
    MqttVersion,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Received,
    Send,
    encode_mqtt,
)

WHERE = ("t", 0)
TOPIC = "phones/p1/commands"


@dataclass
class Client:
    """A client that keeps its session (clean session 0) and follows the spec's receiver rules:
    QoS 2 by method B (MQTT-4.3.3: the packet id is held from the message's delivery to the
    application until PUBREL, and a PUBLISH with a held id is not delivered again)."""

    version: MqttVersion
    decoder: MqttDecoder = field(init=False)
    held: set[int] = field(default_factory=set)  # QoS 2 ids between PUBREC and PUBREL
    to_ack: list[Publish] = field(default_factory=list)  # received, not answered yet
    to_complete: list[int] = field(default_factory=list)  # PUBRELs received, no PUBCOMP yet
    app: list[int] = field(default_factory=list)  # offsets handed to the application
    completed: set[int] = field(default_factory=set)  # acknowledged for good (PUBACK, PUBCOMP)
    # This connection's PUBLISHes, and every id the session sent an offset under (not DUP).
    seen_here: set[int] = field(default_factory=set)
    sent_under: dict[int, int] = field(default_factory=dict)  # offset -> packet id
    pubrec_sent: set[int] = field(default_factory=set)  # offsets

    def __post_init__(self) -> None:
        self.connect()

    def connect(self) -> None:
        self.decoder = MqttDecoder(server_side=False, version=self.version)
        self.seen_here = set()
        self.to_ack = []  # unsent acknowledgements die with the connection
        self.to_complete = []

    def receive(self, data: bytes) -> None:
        self.decoder.feed(data)
        for packet in self.decoder.decode_many():
            if isinstance(packet, Publish):
                self._publish(packet)
            elif isinstance(packet, Pubrel):
                self.to_complete.append(packet.packet_id)
            else:
                assert isinstance(packet, Connack), packet

    def _publish(self, p: Publish) -> None:
        offset = int(p.payload)
        assert offset not in self.completed, f"acknowledged {offset} delivered again"
        assert offset not in self.seen_here, f"{offset} twice on one connection"
        self.seen_here.add(offset)
        before = self.sent_under.get(offset)
        if before is not None:  # MQTT-4.4.0-1: its original id, with DUP (MQTT-3.3.1-1)
            assert p.dup and p.packet_id == before, (p, before)
            assert offset not in self.pubrec_sent, f"{offset} past PUBREC: PUBREL expected"
        else:
            assert not p.dup, p
            # A new message under an id the client still holds would be dropped: lost.
            assert p.packet_id not in self.held, f"id {p.packet_id} reused while held"
            self.sent_under[offset] = p.packet_id
        if p.qos == 2 and p.packet_id in self.held:
            pass  # a duplicate of a message already delivered (method B)
        else:
            self.app.append(offset)
            if p.qos == 2:
                self.held.add(p.packet_id)  # owned now: until its PUBREL
        self.to_ack.append(p)

    def answer(self, index: int, *, reaches: bool = True) -> bytes:
        """The acknowledgement of the ``index``-th PUBLISH waiting for one (any order).
        ``reaches``: the broker reads it (else it is lost with the connection)."""
        p = self.to_ack.pop(index % len(self.to_ack))
        offset = int(p.payload)
        if p.qos == 1:
            if reaches:
                self.completed.add(offset)
            return encode_mqtt(Puback(p.packet_id), self.version)
        if reaches:
            self.pubrec_sent.add(offset)
        return encode_mqtt(Pubrec(p.packet_id), self.version)

    def complete(self, index: int) -> bytes:
        packet_id = self.to_complete.pop(index % len(self.to_complete))
        self.held.discard(packet_id)
        for offset, sent in self.sent_under.items():
            if sent == packet_id and offset in self.pubrec_sent:
                self.completed.add(offset)
        return encode_mqtt(Pubcomp(packet_id), self.version)


class Connection:
    """The broker's side of one connection, driven as ``MqttDevice`` and ``SessionKeeper`` do
    for one partition: a delivery queue, the unacknowledged offsets, the catch-up."""

    def __init__(self, version: MqttVersion, stored: StoredSession | None, reader: int) -> None:
        self.conn = MqttServerConnection(0.0)
        expiry = MqttProperties(session_expiry_interval=3600 if version is MqttVersion.V5 else None)
        connect = Connect("p1", clean_start=False, properties=expiry)
        actions = self.conn.receive(encode_mqtt(connect, version), 0.0)
        assert actions and not self.conn.closed, actions
        self.out: list[bytes] = [self.conn.connack(stored is not None)]
        self.queue: list[tuple[int, int, int]] = []  # (offset, qos, resend packet id)
        self.unacked: set[int] = set()
        self.reader = reader  # the live reader's position on this broker
        self.catch: CatchUp | None = None
        self.in_order_from = 0
        if stored is None:
            return
        progress = stored.positions.get(WHERE)
        if progress is None:
            return
        self.catch = CatchUp(progress)
        self.in_order_from = progress.next
        for owed in progress.owed:
            if owed.packet_id:
                pubrel = self.conn.resume(
                    owed.packet_id, owed.qos, owed.released, (*WHERE, owed.offset)
                )
                self.unacked.add(owed.offset)
                if pubrel:
                    self.out.append(pubrel)

    def deliver(self, offset: int, qos: int, packet_id: int = 0) -> None:
        self.unacked.add(offset)
        self.queue.append((offset, qos, packet_id))

    def live(self, log: list[int]) -> None:
        """The live reader hands the next record to the matching devices (not to this one
        while it catches up on the partition)."""
        if self.catch is None:
            self.deliver(self.reader, log[self.reader])
        self.reader += 1

    def catch_up(self, log: list[int]) -> None:
        """One step of the catch-up (``SessionKeeper._redeliver``)."""
        catch = self.catch
        assert catch is not None
        if catch.caught_up(self.reader):
            self.catch = None  # the live reader delivers from here on
            return
        if catch.cursor >= self.reader:
            return  # waits for the live reader
        offset = catch.cursor
        decided = catch.decide(offset)
        catch.advance(offset + 1)
        if decided is not None:
            qos = decided.qos if decided.packet_id else log[offset]
            self.deliver(offset, qos, decided.packet_id)

    def flush(self, count: int = 1 << 30) -> None:
        """The writer sends the first ``count`` of the queue (``MqttDevice._ready_bytes``)."""
        sending, self.queue = self.queue[:count], self.queue[count:]
        for offset, qos, packet_id in sending:
            tag = (*WHERE, offset)
            if packet_id and not self.conn.reserved(packet_id, tag):
                continue
            data = self.conn.deliver(TOPIC, b"%d" % offset, qos, tag=tag, packet_id=packet_id)
            assert data
            self.out.append(data)

    def receive(self, data: bytes) -> None:
        for action in self.conn.receive(data, 0.0):
            if isinstance(action, Acked):
                assert isinstance(action.tag, tuple)
                self.unacked.discard(action.tag[2])
            elif isinstance(action, Received):
                self.out.append(action.pubrel)  # (the broker saves the session first)
            elif isinstance(action, Send):
                self.out.append(action.data)

    def state(self) -> StoredSession:
        """The session's state as stored when the connection ends, through its record codec."""
        in_flight: dict[Place, tuple[int, int, bool]] = {}
        for tag, pid, qos, released in self.conn.in_flight():
            assert isinstance(tag, tuple)
            in_flight[tag] = (pid, qos, released)
        catching = {} if self.catch is None else {WHERE: self.catch}
        progress = session_progress(
            {WHERE: self.reader},
            catching,
            {WHERE: self.unacked},
            in_flight,
            {WHERE: self.in_order_from},
        )
        decoded = decode_session(encode_session(StoredSession(0, 1, (), progress)))
        assert decoded is not None
        return decoded


class SessionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.version = MqttVersion.V311
        self.log: list[int] = []  # QoS of each record; its offset is its index
        self.client: Client | None = None
        self.broker: Connection | None = None
        self.subscribed_at = 0

    @rule(version=st.sampled_from([MqttVersion.V311, MqttVersion.V5]))
    @precondition(lambda self: self.client is None)
    def start(self, version: MqttVersion) -> None:
        self.version = version
        self.client = Client(version)
        self.subscribed_at = len(self.log)  # what came before is not the session's
        self.broker = Connection(version, None, len(self.log))

    @rule(qos=st.sampled_from([1, 2]))
    def publish(self, qos: int) -> None:
        self.log.append(qos)

    @rule()
    @precondition(lambda self: self.broker is not None)
    def live_reader(self) -> None:
        assert self.broker is not None
        if self.broker.reader < len(self.log):
            self.broker.live(self.log)

    @rule()
    @precondition(lambda self: self.broker is not None and self.broker.catch is not None)
    def catch_up(self) -> None:
        assert self.broker is not None
        self.broker.catch_up(self.log)

    @rule(count=st.integers(1, 4) | st.just(1 << 30))
    @precondition(lambda self: self.broker is not None)
    def write(self, count: int = 1 << 30) -> None:
        """The broker writes part of its queue (the device's window), the client reads."""
        assert self.broker is not None and self.client is not None
        self.broker.flush(count)
        for data in self.broker.out:
            self.client.receive(data)
        self.broker.out.clear()

    @rule(index=st.integers(0, 50))
    @precondition(lambda self: self.client is not None and self.client.to_ack)
    def acknowledge(self, index: int) -> None:
        assert self.broker is not None and self.client is not None
        self.broker.receive(self.client.answer(index))

    @rule(index=st.integers(0, 50))
    @precondition(lambda self: self.client is not None and self.client.to_complete)
    def complete(self, index: int) -> None:
        assert self.broker is not None and self.client is not None
        self.broker.receive(self.client.complete(index))

    @rule(clean=st.booleans(), lost=st.integers(0, 3), elsewhere=st.booleans(), data=st.data())
    @precondition(lambda self: self.broker is not None)
    def reconnect(self, clean: bool, lost: int, elsewhere: bool, data: st.DataObject) -> None:
        """The connection ends (a DISCONNECT; or lost, with the client's last ``lost``
        acknowledgements and what the broker had not written) and the client connects again,
        to this broker or to another whose live reader is anywhere in the log."""
        assert self.broker is not None and self.client is not None
        if clean:
            self.broker.receive(encode_mqtt(Disconnect(), self.version))
        else:
            for _ in range(min(lost, len(self.client.to_ack))):
                self.client.answer(0, reaches=False)
            self.broker.conn.connection_lost()
        stored = self.broker.state()
        reader = self.broker.reader
        if elsewhere:
            reader = data.draw(st.integers(0, len(self.log)), label="reader")
        self.client.connect()
        self.broker = Connection(self.version, stored, reader)

    @invariant()
    def owed_below_next(self) -> None:
        if self.broker is not None:
            self.broker.state()  # Progress checks its invariant

    def teardown(self) -> None:
        """Everything settles: every message reached the application, QoS 2 once."""
        if self.client is None or self.broker is None:
            return
        for _ in range(4 * len(self.log) + 20):
            broker, client = self.broker, self.client
            if broker.reader < len(self.log):
                broker.live(self.log)
            if broker.catch is not None:
                broker.catch_up(self.log)
            self.write()
            while client.to_ack:
                broker.receive(client.answer(0))
            while client.to_complete:
                broker.receive(client.complete(0))
            self.write()
        assert self.broker.catch is None and not self.broker.unacked
        for offset, qos in enumerate(self.log):
            if offset < self.subscribed_at:
                continue
            got = self.client.app.count(offset)
            if qos == 2:
                assert got == 1, f"QoS 2 offset {offset} delivered {got} times"
            else:
                assert got >= 1, f"QoS 1 offset {offset} lost"


TestSessionMachine = SessionMachine.TestCase
TestSessionMachine.settings = settings(max_examples=300, stateful_step_count=40, deadline=None)


def test_progress_keeps_owed_offsets_below_next() -> None:
    with pytest.raises(ValueError):
        Progress(5, (Owed(5),))
    assert Progress(9, (Owed(3, 7, 1), Owed(6))).resume == 3
    assert Progress(9).resume == 9


def test_a_catch_up_resends_in_flight_sends_unsent_and_skips_acknowledged() -> None:
    catch = CatchUp(Progress(10, (Owed(4, 17, 2), Owed(6), Owed(8, 3, 2, released=True))))
    assert catch.cursor == 4
    assert [catch.decide(o) for o in range(4, 12)] == [
        Owed(4, 17, 2),  # in flight: the PUBLISH again, under id 17
        None,  # acknowledged
        Owed(6),  # queued when the connection ended: sent as new
        None,
        None,  # past PUBREC: its PUBREL went at the reconnect
        None,
        Owed(10),  # from next on, everything
        Owed(11),
    ]


def test_a_catch_up_gives_up_in_flight_deliveries_the_log_no_longer_has() -> None:
    catch = CatchUp(Progress(10, (Owed(2, 5, 1), Owed(3), Owed(7, 6, 1))))
    assert catch.advance(5) == [Owed(2, 5, 1)]  # the log now starts at 5
    assert catch.progress([Owed(7, 6, 1)]) == Progress(10, (Owed(7, 6, 1),))


def test_a_stored_session_keeps_its_in_flight_deliveries() -> None:
    session = StoredSession(
        1, 4, (), {WHERE: Progress(12, (Owed(3, 9, 2, True), Owed(5, 10, 1), Owed(11)))}
    )
    assert decode_session(encode_session(session)) == session


def test_queued_deliveries_fold_into_next_only_where_they_went_in_order() -> None:
    # Live deliveries queued and never sent, above the last one sent: from the first of them
    # on, every matching record is owed, and one number says so.
    live = session_progress(
        {WHERE: 20}, {}, {WHERE: {11, 14, 15, 18}}, {(*WHERE, 11): (7, 1, False)}, {}
    )
    assert live == {WHERE: Progress(14, (Owed(11, 7, 1),))}
    # Resumed with 6 never sent and 8 past PUBREC, whose PUBCOMP then came: 7 and 9 were
    # acknowledged before, so 6 stays listed (the records after it did not go in order).
    catch = CatchUp(Progress(10, (Owed(6), Owed(8, 3, 2, released=True))))
    resumed = session_progress({WHERE: 12}, {WHERE: catch}, {WHERE: set()}, {}, {WHERE: 10})
    assert resumed == {WHERE: Progress(10, (Owed(6),))}
