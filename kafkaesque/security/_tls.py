"""TLS contexts for every listener and client (stdlib ``ssl``), and one that picks up a renewed
certificate without a restart. TLS 1.2 is the floor everywhere."""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable
from typing import Final

log = logging.getLogger(__name__)

_RELOAD_EVERY_S: Final = 1.0


def server_context(
    cert: str,
    key: str | None,
    *,
    client_ca: str | None = None,
    require_client_cert: bool = False,
) -> ssl.SSLContext:
    """A server context with the chain ``cert`` (PEM) and ``key`` (None: the key is in
    ``cert``). With ``client_ca``, clients may present a certificate that CA signed (checked if
    presented); ``require_client_cert`` makes it mandatory (mutual TLS: needs ``client_ca``).
    Raises ValueError for ``require_client_cert`` without ``client_ca``, OSError/ssl.SSLError
    for unreadable or mismatched files."""
    if require_client_cert and client_ca is None:
        raise ValueError("require_client_cert needs client_ca: the CA that signs the clients")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    if client_ca is not None:
        context.load_verify_locations(cafile=client_ca)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
    return context


def client_context(
    ca: str | None,
    *,
    cert: str | None = None,
    key: str | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client context that verifies the server against ``ca`` (PEM; None: the system's
    trust store), and checks its name or IP address unless ``check_hostname`` is False. With
    ``cert`` (and ``key``, None: in ``cert``) it presents a client certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is None:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    else:
        context.load_verify_locations(cafile=ca)
    context.check_hostname = check_hostname
    context.verify_mode = ssl.CERT_REQUIRED  # the server is always verified, even by address
    if cert is not None:
        context.load_cert_chain(cert, key)
    elif key is not None:
        raise ValueError("a client key needs its certificate (cert)")
    return context


class ReloadingContext:
    """A server context whose certificate follows its files.

    ``context`` returns the same ``ssl.SSLContext`` every time (listeners keep it); when the
    cert or key file's mtime or size changed (checked at most once a second of ``clock``), the
    new chain is loaded into it, so connections accepted afterwards get the renewed certificate
    and open ones keep theirs. A reload that fails (a half-written pair, a key that does not
    match) keeps the old certificate, logs the error, and is tried again when the files change.
    ``kw`` are ``server_context``'s keywords (``client_ca``, ``require_client_cert``).
    """

    def __init__(
        self,
        cert: str,
        key: str | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        client_ca: str | None = None,
        require_client_cert: bool = False,
    ) -> None:
        self.cert = cert
        self.key = key
        self._clock = clock
        self._identity = self._stat()
        self._context = server_context(
            cert, key, client_ca=client_ca, require_client_cert=require_client_cert
        )
        self._checked_at = clock()
        self.reloads = 0  # how many times a renewed chain was loaded

    def _stat(self) -> tuple[tuple[int, int] | None, ...]:
        identity: list[tuple[int, int] | None] = []
        for path in (self.cert, self.key):
            if path is None:
                identity.append(None)
                continue
            try:
                st = os.stat(path)
            except OSError:
                identity.append(None)
            else:
                identity.append((st.st_mtime_ns, st.st_size))
        return tuple(identity)

    @property
    def context(self) -> ssl.SSLContext:
        """The context, with the files' current chain (checked at most once a second)."""
        now = self._clock()
        if now - self._checked_at >= _RELOAD_EVERY_S:
            self._checked_at = now
            self.reload_if_changed()
        return self._context

    def reload_if_changed(self) -> bool:
        """Load the chain now if the files changed; whether a new chain was loaded."""
        identity = self._stat()
        if identity == self._identity:
            return False
        self._identity = identity  # a failure is logged once per change, not once a second
        try:
            # Load into a throwaway context first: a bad pair must not leave the live context
            # with a certificate and a key that do not match.
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert, self.key)
            self._context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as exc:
            log.error("TLS certificate %s not reloaded, keeping the old one: %s", self.cert, exc)
            return False
        self.reloads += 1
        log.info("TLS certificate %s reloaded", self.cert)
        return True
