"""The fsync helper: a process that fdatasyncs the files whose descriptors its broker sends.

Started by ``FsyncWorkers`` as a script (``python -I -S _fsync_helper.py SOCKET_FD EVENT_FD``):
standard library only and no import of the package, so it starts in milliseconds and holds a
few MiB. Why a process: a worker thread of the broker needs the GIL after each fsync, and under
load that wait, not the fsync, was most of a write's latency (``FsyncWorkers``).

Protocol over the SOCK_SEQPACKET socket ``SOCKET_FD``: a request is one or more messages of one
byte, each carrying up to ``MAX_FDS`` file descriptors (SCM_RIGHTS); ``+`` says more messages of
the request follow, ``.`` ends it. The helper fdatasyncs each descriptor in order and closes it
(after a failure it only closes the rest), then answers one message for the whole request, the
ASCII errno of the first failure or ``0``, and then adds 1 to the eventfd ``EVENT_FD`` (the
driver's loop waits on it). End of file on the socket (the broker closed it, or died) ends the
helper. SIGINT and SIGTERM are ignored: the helper shares its broker's process group, and its
broker ends it.
"""

import os
import signal
import socket
import sys

MAX_FDS = 253  # SCM_MAX_FD: what one message can carry


def serve(sock: socket.socket, event_fd: int) -> None:
    """Answer requests until end of file on ``sock``."""
    failure = 0
    while True:
        message, fds, _flags, _address = socket.recv_fds(sock, 16, MAX_FDS)
        for fd in fds:
            try:
                if not failure:
                    os.fdatasync(fd)
            except OSError as exc:
                failure = exc.errno or -1
            finally:
                os.close(fd)
        if not message:
            return
        if message == b".":
            sock.send(str(failure).encode())
            os.eventfd_write(event_fd, 1)
            failure = 0


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(sock, int(sys.argv[2]))


if __name__ == "__main__":
    main()
