"""How a client proves who it is: TLS, then a SASL exchange in ``AUTH`` lines (docs/security.md).

``Security`` is the setting (Kafka's ``security.protocol`` and its ``sasl.*`` / ``ssl.*`` keys);
``SaslHandshake`` is the exchange, sans I/O: ``start()`` gives the first ``AUTH`` command, each
response goes to ``step``, which gives the next command or None once the broker said
``authenticated`` (and, for SCRAM, proved it knows the password too). The sync and trio
connections move the bytes; a failure is a ``KafkaesqueError`` with code ``AUTH_FAILED`` (not
retriable: sending the same credentials again cannot help).
"""

from __future__ import annotations

import functools
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from kafkaesque.protocol import (
    AUTH_MECHANISMS,
    Authenticate,
    ErrorCode,
    ErrorReply,
    OkReply,
    RemoteProtocolError,
    auth_reply_parts,
)
from kafkaesque.security import (
    AuthenticationFailed,
    ScramClient,
    client_context,
    plain_message,
)

from ._errors import KafkaesqueConnectionError, KafkaesqueError
from ._wire import Response, shown

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
"""Kafka's ``security.protocol`` values: TLS or not, SASL or not."""

_SCRAM: Final = "SCRAM-SHA-256"
_PLAIN: Final = "PLAIN"


@dataclass(frozen=True)
class Security:
    """How a client connects: Kafka's ``security.protocol`` and what it needs.

    ``protocol``: ``PLAINTEXT`` (neither), ``SSL`` (TLS), ``SASL_PLAINTEXT`` (``AUTH`` without
    TLS: only SCRAM, which sends no password), ``SASL_SSL`` (both). ``sasl_mechanism``:
    ``SCRAM-SHA-256`` or ``PLAIN`` (which sends the password, so it is refused here unless over
    TLS). ``ssl_cafile``: the PEM CA the broker's certificate must chain to (None: the system's
    trust store); ``ssl_certfile``/``ssl_keyfile``: a client certificate (the key may be in the
    certificate's file); ``ssl_check_hostname``: whether the certificate must name the host or
    IP address connected to. ``ValueError`` for a setting that cannot work (an unknown protocol
    or mechanism, SASL without a user name or password, credentials or files the protocol does
    not use, PLAIN without TLS). The password never shows in ``repr``.
    """

    protocol: str = "PLAINTEXT"
    sasl_mechanism: str = _SCRAM
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True

    def __post_init__(self) -> None:
        protocol, mechanism = self.protocol.upper(), self.sasl_mechanism.upper()
        object.__setattr__(self, "protocol", protocol)
        object.__setattr__(self, "sasl_mechanism", mechanism)
        if protocol not in PROTOCOLS:
            raise ValueError(f"security.protocol must be {'|'.join(PROTOCOLS)}, not {protocol!r}")
        if mechanism not in AUTH_MECHANISMS:
            raise ValueError(
                f"sasl.mechanism must be {'|'.join(AUTH_MECHANISMS)}, not {self.sasl_mechanism!r}"
            )
        if self.uses_sasl:
            if not self.username or self.password is None:
                raise ValueError(f"{protocol} needs a user name and a password")
            if mechanism == _PLAIN and not self.uses_tls:
                raise ValueError(
                    "PLAIN sends the password: it is allowed over TLS only (use SASL_SSL, or "
                    "SCRAM-SHA-256)"
                )
        elif self.username is not None or self.password is not None:
            raise ValueError(
                f"a user name and password need SASL_SSL or SASL_PLAINTEXT, not {protocol}"
            )
        files = (self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)
        if not self.uses_tls and any(f is not None for f in files):
            raise ValueError(f"TLS files need SSL or SASL_SSL, not {protocol}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("a client key needs its certificate (ssl_certfile)")

    def __getstate__(self) -> dict[str, object]:
        # Pickled (Spark sends it to its executors) without the cached SSLContext, which cannot
        # be pickled: each process builds its own from the files.
        return {k: v for k, v in self.__dict__.items() if k != "ssl_context"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)

    @property
    def uses_tls(self) -> bool:
        """Whether connections start with a TLS handshake."""
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        """Whether connections authenticate with ``AUTH`` before their first command."""
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @functools.cached_property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context (built once, on first use), or None without TLS.

        ``OSError``/``ssl.SSLError`` for unreadable or broken files."""
        if not self.uses_tls:
            return None
        return client_context(
            self.ssl_cafile,
            cert=self.ssl_certfile,
            key=self.ssl_keyfile,
            check_hostname=self.ssl_check_hostname,
        )

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> Security:
        """The setting named by Kafka-style client options (as Spark's Kafka source takes them,
        without the ``kafka.`` prefix): ``security.protocol``, ``sasl.mechanism``,
        ``sasl.username``, ``sasl.password`` (or ``sasl.jaas.config`` with ``username="..."
        password="..."``), ``ssl.truststore.location`` (a PEM file; also ``ssl.cafile``),
        ``ssl.truststore.type`` and ``ssl.keystore.type`` (``PEM`` only),
        ``ssl.keystore.location`` (a PEM file with certificate and key; also ``ssl.certfile``
        and ``ssl.keyfile``), ``ssl.endpoint.identification.algorithm`` (``https``, the
        default, checks the broker's name; empty turns that off). Other keys are left alone,
        but an unknown ``sasl.*`` or ``ssl.*`` key is a ``ValueError`` naming it (a typo must
        not quietly turn security off); so are values that cannot work (see the class)."""
        unknown = sorted(
            key for key in options if key.startswith(("sasl.", "ssl.")) and key not in _OPTION_KEYS
        )
        if unknown:
            raise ValueError(
                f"unknown security option(s) {', '.join(unknown)}; known: "
                f"security.protocol, {', '.join(sorted(_OPTION_KEYS))}"
            )
        username, password = options.get("sasl.username"), options.get("sasl.password")
        jaas = options.get("sasl.jaas.config")
        if jaas is not None:
            found = dict(_JAAS_OPTION.findall(jaas))
            username = username if username is not None else found.get("username")
            password = password if password is not None else found.get("password")
        for key in ("ssl.truststore.type", "ssl.keystore.type"):
            if options.get(key, "PEM").upper() != "PEM":
                raise ValueError(
                    f"{key} must be PEM (JKS and PKCS12 are not read), not {options[key]!r}"
                )
        algorithm = options.get("ssl.endpoint.identification.algorithm", "https")
        if algorithm.lower() not in ("", "https"):
            raise ValueError(
                f"ssl.endpoint.identification.algorithm must be https or empty, not {algorithm!r}"
            )
        keystore = options.get("ssl.keystore.location")
        certfile = options.get("ssl.certfile", keystore)
        return cls(
            protocol=options.get("security.protocol", "PLAINTEXT"),
            sasl_mechanism=options.get("sasl.mechanism", _SCRAM),
            username=username,
            password=password,
            ssl_cafile=options.get("ssl.truststore.location", options.get("ssl.cafile")),
            ssl_certfile=certfile,
            ssl_keyfile=options.get("ssl.keyfile"),
            ssl_check_hostname=algorithm != "",
        )


PLAINTEXT: Final = Security()
"""No TLS, no authentication: what a client does unless told otherwise."""

_OPTION_KEYS: Final = frozenset(
    {
        "sasl.mechanism",
        "sasl.username",
        "sasl.password",
        "sasl.jaas.config",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.cafile",
        "ssl.keystore.location",
        "ssl.keystore.type",
        "ssl.certfile",
        "ssl.keyfile",
        "ssl.endpoint.identification.algorithm",
    }
)
_JAAS_OPTION: Final = re.compile(r'\b(username|password)\s*=\s*"((?:[^"\\]|\\.)*)"')


def auth_failed(where: str, why: str) -> KafkaesqueError:
    """The error of a connection that could not authenticate (``AUTH_FAILED``, not retriable)."""
    return KafkaesqueError(ErrorCode.AUTH_FAILED, f"{where}: {why}")


def tls_failed(where: str, exc: BaseException) -> KafkaesqueError:
    """The error of a TLS handshake that failed: ``AUTH_FAILED`` (not retriable) when TLS itself
    refused (an untrusted or misnamed certificate, a peer that does not speak TLS), a retriable
    connection error when the connection merely dropped during the handshake."""
    if isinstance(exc, ssl.SSLError) and not isinstance(
        exc, ssl.SSLEOFError | ssl.SSLZeroReturnError
    ):
        if isinstance(exc, ssl.SSLCertVerificationError):
            reason = f"certificate verify failed: {exc.verify_message} (is ssl_cafile its CA?)"
        else:
            reason = exc.reason or str(exc)
        return auth_failed(where, f"TLS handshake failed: {reason}")
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return KafkaesqueConnectionError(f"{where}: TLS handshake failed: {reason}", sent=False)


class SaslHandshake:
    """One SASL exchange over ``AUTH`` lines, sans I/O: ``start()``, then ``step(response)``
    with each response until it returns None; ``username`` is then who the broker says we are.

    ``step`` raises ``KafkaesqueError``: ``AUTH_FAILED`` for a refusal (``-ERR AUTH_FAILED``, or
    any other non-retriable code, e.g. ``UNKNOWN_COMMAND`` from a broker that has no ``AUTH``),
    a malformed answer, or a SCRAM server-final whose signature is wrong (the broker does not
    know the password: it is not the cluster's); a retriable ``KafkaesqueConnectionError`` when
    the broker answered with a retriable code (``NOT_READY`` while it stops, ``BUSY``).
    """

    def __init__(self, security: Security, where: str) -> None:
        if not security.uses_sasl:
            raise ValueError(f"{security.protocol} has no SASL exchange")
        assert security.username is not None and security.password is not None  # __post_init__
        self._security = security
        self._where = where
        self._mechanism = security.sasl_mechanism
        self._scram: ScramClient | None = None
        self._sent_final = False
        self.username: str | None = None

    def start(self) -> Authenticate:
        """The first ``AUTH`` command."""
        security = self._security
        assert security.username is not None and security.password is not None
        try:
            if self._mechanism == _PLAIN:
                return Authenticate(_PLAIN, plain_message(security.username, security.password))
            self._scram = ScramClient(security.username, security.password)
            return Authenticate(_SCRAM, self._scram.first())
        except ValueError as exc:
            raise auth_failed(self._where, f"cannot send these credentials: {exc}") from exc

    def step(self, response: Response) -> Authenticate | None:
        """The next ``AUTH`` command for the broker's ``response``, or None when done."""
        if isinstance(response, ErrorReply):
            what = f"AUTH {self._mechanism} answered -ERR {response.code.name} {response.message}"
            if response.code.retriable:
                raise KafkaesqueConnectionError(f"{self._where}: {what}", sent=False)
            raise auth_failed(self._where, what)
        if not isinstance(response, OkReply):
            raise auth_failed(self._where, f"AUTH answered {shown(response)}")
        try:
            step, username, payload = auth_reply_parts(response.text)
        except RemoteProtocolError as exc:
            raise auth_failed(self._where, str(exc)) from exc
        try:
            return self._next(step, username, payload)
        except AuthenticationFailed as exc:
            raise auth_failed(self._where, str(exc)) from exc

    def _next(self, step: str, username: str | None, payload: bytes) -> Authenticate | None:
        scram = self._scram
        if step == "continue":
            if scram is None or self._sent_final:
                raise AuthenticationFailed(f"the broker asked for another {self._mechanism} step")
            self._sent_final = True
            return Authenticate(_SCRAM, scram.final(payload))
        if scram is not None:
            if not self._sent_final or not payload:
                raise AuthenticationFailed("the broker ended SCRAM without proving the password")
            scram.verify(payload)  # mutual authentication: raises if the signature is wrong
        elif payload:
            raise AuthenticationFailed("PLAIN's answer carries no server message")
        self.username = username
        return None
