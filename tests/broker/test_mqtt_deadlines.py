"""``Deadlines``: one heap for every MQTT connection's deadline."""

from __future__ import annotations

from dataclasses import dataclass

from kafkaesque.broker.mqtt._deadlines import Deadlines


@dataclass
class _Conn:
    at: float
    closed: bool = False

    def deadline(self) -> float:
        return self.at


@dataclass(eq=False)
class _Device:
    name: str
    conn: _Conn


def _device(name: str, at: float) -> _Device:
    return _Device(name, _Conn(at))


def test_due_connections_come_out_once_in_deadline_order() -> None:
    heap: Deadlines[_Device] = Deadlines()
    late, early, later = _device("late", 5.0), _device("early", 1.0), _device("later", 9.0)
    for device in (late, early, later):
        heap.add(device)
    assert heap.due(0.5) == []
    assert heap.due(5.0) == [early, late]
    assert heap.due(5.0) == []  # the caller closes them: they are not handed out twice
    assert heap.due(100.0) == [later]
    assert len(heap) == 0


def test_a_deadline_that_moved_later_is_looked_at_again_then() -> None:
    heap: Deadlines[_Device] = Deadlines()
    device = _device("chatty", 10.0)  # e.g. the CONNECT timeout
    heap.add(device)
    device.conn.at = 25.0  # the CONNECT came, with a keep-alive
    assert heap.due(12.0) == []
    assert len(heap) == 1
    device.conn.at = 40.0  # a packet came
    assert heap.due(30.0) == []
    assert heap.due(40.0) == [device]


def test_a_closed_connection_is_never_due() -> None:
    heap: Deadlines[_Device] = Deadlines()
    gone = _device("gone", 1.0)
    heap.add(gone)
    gone.conn.closed = True
    assert heap.due(2.0) == []
    assert len(heap) == 0


def test_closed_connections_without_deadline_leave_once_they_are_half_the_heap() -> None:
    heap: Deadlines[_Device] = Deadlines()
    devices = [_device(f"d{i}", float("inf")) for i in range(300)]  # keep-alive 0
    for device in devices:
        heap.add(device)
    for device in devices[:100]:
        device.conn.closed = True
        heap.ended()
    assert len(heap) == 300  # a third closed: not worth a rebuild yet
    for device in devices[100:151]:
        device.conn.closed = True
        heap.ended()
    assert len(heap) == 149  # just over half: rebuilt without them
    assert heap.due(float("inf")) == devices[151:]


def test_a_deadline_that_moved_earlier_is_due_then_and_handed_out_once() -> None:
    heap: Deadlines[_Device] = Deadlines()
    device = _device("silent", 10.0)  # the CONNECT timeout
    other = _device("other", 5.0)
    heap.add(device)
    heap.add(other)
    device.conn.at = 1.5  # CONNECT accepted with a keep-alive of 1 s
    heap.moved_earlier(device)
    assert heap.due(1.0) == []
    assert heap.due(1.5) == [device]
    # Its first entry (the connect timeout) is stale: skipped, never handed out again.
    assert heap.due(10.0) == [other]
    assert len(heap) == 0


def test_a_stale_entry_does_not_hide_the_live_one_moving_later() -> None:
    heap: Deadlines[_Device] = Deadlines()
    device = _device("chatty", 10.0)
    heap.add(device)
    device.conn.at = 1.5
    heap.moved_earlier(device)
    device.conn.at = 12.0  # packets kept coming
    assert heap.due(11.0) == []  # the live entry was pushed back; the stale one skipped
    assert len(heap) == 1
    assert heap.due(12.0) == [device]


def test_a_rebuild_drops_stale_entries() -> None:
    heap: Deadlines[_Device] = Deadlines()
    devices = [_device(f"d{i}", float("inf")) for i in range(200)]  # keep-alive 0
    moved = [_device(f"m{i}", 10.0) for i in range(10)]
    for device in devices + moved:
        heap.add(device)
    for device in moved:
        device.conn.at = float("inf")  # CONNECT accepted, keep-alive 0
        heap.moved_earlier(device)
    assert len(heap) == 220
    for device in devices[:111]:
        device.conn.closed = True
        heap.ended()
    assert len(heap) == 99  # rebuilt without the closed ones nor the stale entries
    assert heap.due(float("inf")) == devices[111:] + moved
    assert not heap._moved


def test_moved_items_are_forgotten_once_all_their_entries_left() -> None:
    heap: Deadlines[_Device] = Deadlines()
    device = _device("silent", 10.0)
    heap.add(device)
    device.conn.at = 1.0
    heap.moved_earlier(device)
    assert heap.due(1.0) == [device]
    assert heap.due(10.0) == []
    assert len(heap) == 0 and not heap._moved
