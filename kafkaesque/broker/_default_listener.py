"""Opening a listener that is on by default beside the client port (Kafka, REST).

Such a port was not asked for, so a port already taken there must not stop the broker: the
listener stays off, with a warning that names the flag to move or disable it. A port given
explicitly must bind.
"""

from __future__ import annotations

import errno
import logging

import trio

from ._config import Address

log = logging.getLogger("kafkaesque.broker")


async def open_listeners(
    where: Address, *, explicit: bool, what: str, flag: str, broker_id: int
) -> list[trio.SocketListener] | None:
    """Listen on ``where``; None, after a warning, when it is the default (not ``explicit``)
    and its port is taken. ``what`` names the listener and ``flag`` its option in the warning.
    Raises ``OSError`` otherwise."""
    try:
        return await trio.open_tcp_listeners(where.port, host=where.host)
    except OSError as exc:
        if explicit or exc.errno != errno.EADDRINUSE:
            raise
        log.warning(
            "broker %d: no %s listener: the default %s is taken (%s); set %s host:port, or %s off",
            broker_id,
            what,
            where,
            exc.strerror,
            flag,
            flag,
        )
        return None
