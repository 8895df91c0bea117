"""Who a line-protocol connection is, and what it may do (issue 25, docs/security.md).

``AccessControl`` answers ``AUTH`` for a session (SCRAM-SHA-256 on any listener, PLAIN only over
TLS), refuses an address that failed too often without checking it (``FailureLimiter``), and
decides whether a session's command is allowed: before authentication only PING, HELP, QUIT and
AUTH; then what ``kafkaesque.security.required`` says the command needs, through the
``Authorizer`` with the cluster's ACLs (the controller quorum's, pushed here by ``set_acls`` the
moment a new view arrives). Refusals are logged at INFO and counted in ``/metrics``.

The hot path. A broker without a users file and without ACLs checks nothing:
``CommandHandler`` tests ``enforcing`` (one attribute) and goes on. With a users file and no
ACLs, a command costs a test of the session's principal. With ACLs, decisions are cached by the
``Authorizer`` per (principal, operation, resource, name) for the current set of ACLs (one
frozenset while they do not change: a new set starts a new cache).

Threads: PLAIN's PBKDF2 check (``verify_password``) runs in a worker thread through
``_thread_bridge.run_in_thread``; everything else here runs on the event loop and never blocks
(SCRAM's server side is a few HMACs).

The MQTT listener may share ``users`` and ``limiter`` (one users file, one count of failures per
address for both protocols).
"""

from __future__ import annotations

import base64
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn, Protocol

from kafkaesque.protocol import (
    AclOperation,
    AclResource,
    AclRow,
    Authenticate,
    Command,
    ErrorCode,
    ErrorReply,
    Help,
    OkReply,
    Ping,
    PublishBatch,
    PublishRecord,
    Pubs,
    Quit,
    encode_reply,
)
from kafkaesque.security import (
    MECHANISM,
    PLAIN_MECHANISM,
    AuthenticationFailed,
    Authorizer,
    FailureLimiter,
    ScramCredential,
    ScramServer,
    UsersFileError,
    UserStore,
    derive_credential,
    parse_plain,
    required,
    user_principal,
    verify_password,
)

from . import _thread_bridge
from ._config import BrokerConfig, ConfigError
from ._errors import RequestError
from ._session import ANONYMOUS, Session

log = logging.getLogger("kafkaesque.broker.access")

AUTHENTICATION_REQUIRED = f"authentication required: AUTH {MECHANISM} first (docs/security.md)"
NOT_ENABLED = "authentication is not enabled on this broker"
UNAUTHENTICATED = "unauthenticated"
"""The ``operation`` label of a command refused because its connection had not authenticated."""

# What a connection may send before it authenticated.
_OPEN_COMMANDS = (Ping, Help, Quit, Authenticate)
_PUBLISHES = (Pubs, PublishRecord, PublishBatch)
_GS2_STARTS = (b"n,", b"y,", b"p=")  # how a SCRAM client-first message begins (RFC 5802)


class AccessMetrics(Protocol):
    """The counters AccessControl moves (``BrokerMetrics`` has them)."""

    def auth_failed(self) -> None: ...

    def authorization_failed(self, operation: str) -> None: ...


class AccessControl:
    """Authentication and authorization of line-protocol sessions (see the module docstring).

    ``users`` is None on a broker without a users file: every session is ``ANONYMOUS`` and AUTH
    answers ``AUTH_FAILED`` (not enabled). ``users`` and ``limiter`` are public so that the MQTT
    listener can share them.
    """

    def __init__(
        self,
        users: UserStore | None,
        authorizer: Authorizer,
        limiter: FailureLimiter,
        metrics: AccessMetrics,
        *,
        broker_id: int = 0,
    ) -> None:
        self.users = users
        self.authorizer = authorizer
        self.limiter = limiter
        self._metrics = metrics
        self._broker_id = broker_id
        self.acls: frozenset[AclRow] = frozenset()
        # Whether anything is checked at all: a users file, or ACLs (see the module docstring).
        self.enforcing = users is not None
        self._decoy: ScramCredential | None = None  # PLAIN's check for an unknown user

    @classmethod
    def from_config(
        cls,
        config: BrokerConfig,
        metrics: AccessMetrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> AccessControl:
        """The access control ``config`` asks for: its users file (``ConfigError`` if it
        cannot be read or has a bad line: the broker does not start), super users and failure
        limit."""
        users = None
        if config.users_file is not None:
            try:
                users = UserStore(config.users_file, clock=clock)
            except UsersFileError as exc:
                raise ConfigError(f"users_file: {exc}") from exc
        return cls(
            users,
            Authorizer(config.super_users),
            FailureLimiter(config.auth_failure_limit, config.auth_failure_window_s, clock=clock),
            metrics,
            broker_id=config.id,
        )

    # -- sessions -------------------------------------------------------------------------------

    def new_session(self, address: str, *, tls: bool) -> Session:
        """The session of a new connection from ``address`` (the peer's host): anonymous on a
        broker without a users file, else not authenticated yet."""
        principal = ANONYMOUS if self.users is None else None
        return Session(address, tls=tls, principal=principal)

    def set_acls(self, acls: frozenset[AclRow]) -> None:
        """The cluster's ACLs from now on (a new metadata view's): called on the event loop as
        the view arrives (``ClusterMetadata.add_view_listener``). Quick, never raises."""
        if acls is not self.acls:
            self.acls = acls
            self.enforcing = self.users is not None or bool(acls)

    # -- authorization --------------------------------------------------------------------------

    def check(self, command: Command, session: Session) -> None:
        """Raise ``RequestError(NOT_AUTHORIZED)`` unless ``session`` may send ``command``
        (what ``required`` says it needs). Commands whose rows are filtered (TOPICS, METADATA,
        GROUPS) pass: see ``visible``. Called only while ``enforcing``."""
        principal = session.principal
        if principal is None:
            if isinstance(command, _OPEN_COMMANDS):
                return
            self._refuse(session, UNAUTHENTICATED, None, AUTHENTICATION_REQUIRED)
        acls = self.acls
        if not acls:
            return  # no ACLs: anyone authenticated may do anything
        if isinstance(command, _PUBLISHES):  # the hot path: one requirement, no tuple
            if not self.authorizer.authorize(
                principal, acls, AclOperation.WRITE, AclResource.TOPIC, command.topic
            ):
                self._denied(session, AclOperation.WRITE, AclResource.TOPIC, command.topic)
            return
        for operation, resource, name in required(command):
            if not self.authorizer.authorize(principal, acls, operation, resource, name):
                self._denied(session, operation, resource, name)

    def check_operation(
        self, session: Session, operation: AclOperation, resource: AclResource, name: str
    ) -> None:
        """Raise ``RequestError(NOT_AUTHORIZED)`` unless ``session`` may do ``operation`` on
        ``resource`` ``name`` (an auto-creation's create topic, LEAVE's read group)."""
        if not self.enforcing:
            return
        principal = session.principal
        if principal is None:
            self._refuse(session, UNAUTHENTICATED, None, AUTHENTICATION_REQUIRED)
        if self.acls and not self.authorizer.authorize(
            principal, self.acls, operation, resource, name
        ):
            self._denied(session, operation, resource, name)

    def allows(
        self, session: Session, operation: AclOperation, resource: AclResource, name: str
    ) -> bool:
        """``check_operation`` as a yes or no (a refusal is counted all the same): for a
        front that answers a refusal with its own code (Kafka's) rather than an error."""
        try:
            self.check_operation(session, operation, resource, name)
        except RequestError:
            return False
        return True

    def require_authentication(self, session: Session) -> None:
        """Raise ``RequestError(NOT_AUTHORIZED)``, logged and counted as a refusal of an
        unauthenticated connection, if ``session`` has not authenticated on a broker that wants
        it (a Kafka request other than ApiVersions and the SASL ones, before SASL)."""
        if session.principal is None:
            self._refuse(session, UNAUTHENTICATED, None, AUTHENTICATION_REQUIRED)

    def visible(
        self, session: Session | None, resource: AclResource, names: Iterable[str]
    ) -> list[str]:
        """The ``names`` (in order) ``session`` may describe: the rows of TOPICS, METADATA and
        GROUPS it sees. All of them when nothing is enforced or the session is a peer's."""
        if session is None or not self.enforcing or not self.acls:
            return list(names)
        principal = session.principal
        if principal is None:
            return []
        return self.authorizer.allowed_names(
            principal, self.acls, AclOperation.DESCRIBE, resource, names
        )

    def _denied(
        self, session: Session, operation: AclOperation, resource: AclResource, name: str
    ) -> NoReturn:
        message = f"{session.principal} may not {operation} {resource} {name}"
        self._refuse(session, str(operation), f"{resource} {name}", message)

    def _refuse(self, session: Session, operation: str, resource: str | None, why: str) -> NoReturn:
        self._metrics.authorization_failed(operation)
        log.info(
            "broker %d: refused %s from %s: %s%s",
            self._broker_id,
            session.principal or "an unauthenticated connection",
            session.address or "?",
            operation,
            "" if resource is None else f" {resource}",
        )
        raise RequestError(ErrorCode.NOT_AUTHORIZED, why)

    # -- authentication -------------------------------------------------------------------------

    async def authenticate(self, session: Session, command: Authenticate) -> bytes:
        """The encoded reply to one ``AUTH`` step of ``session`` (see docs/protocol.md):
        ``+OK continue <base64>`` (SCRAM's challenge), ``+OK authenticated <user> [<base64>]``
        (the session's principal is then ``User:<user>``), or ``-ERR AUTH_FAILED <why>``, which
        ends the exchange (a new AUTH starts another). A failure leaves the principal as it was.
        """
        step = await self.sasl_step(session, command.mechanism, command.payload)
        if step.failure is not None:
            return encode_reply(ErrorReply(ErrorCode.AUTH_FAILED, step.failure))
        if step.user is None:
            return encode_reply(OkReply(f"continue {_b64(step.data)}"))
        text = f"authenticated {step.user}"
        if step.data:
            text += f" {_b64(step.data)}"
        return encode_reply(OkReply(text))

    async def sasl_step(self, session: Session, mechanism: str, payload: bytes) -> SaslStep:
        """One step of a SASL exchange of ``session`` with ``mechanism`` (SCRAM-SHA-256 on any
        connection, PLAIN over TLS only), whatever protocol carries it (``AUTH`` lines, Kafka's
        SaslAuthenticate). On success the session's principal becomes ``User:<user>``; a
        failure ends the exchange, leaves the principal as it was, is counted in ``/metrics``
        and, if the credentials were wrong, toward the address's failure limit."""
        if self.users is None:
            return self._failed(session, NOT_ENABLED, counted=False)
        mechanism = mechanism.upper()
        if mechanism not in (MECHANISM, PLAIN_MECHANISM):
            session.sasl = None
            return self._failed(
                session,
                f"mechanism {mechanism} is not offered: {MECHANISM}, or {PLAIN_MECHANISM} over TLS",
                counted=False,
            )
        wait = self.limiter.blocked(session.address)
        if wait > 0:
            session.sasl = None
            return self._failed(
                session,
                f"too many failed attempts from {session.address}: retry in "
                f"{max(1, math.ceil(wait))} s",
                counted=False,
            )
        if mechanism == PLAIN_MECHANISM:
            session.sasl = None
            return await self._plain(session, payload)
        return self._scram(session, self.users, payload)

    def _scram(self, session: Session, users: UserStore, payload: bytes) -> SaslStep:
        server = session.sasl
        # A client-first message (it opens with a GS2 header, "n," or "y,"; a client-final
        # with "c=") starts a new exchange, abandoning any in progress.
        if payload[:2] in _GS2_STARTS:
            server = None
        try:
            if not isinstance(server, ScramServer):  # the first step of a new exchange
                server = ScramServer(users.credential)
                session.sasl = server
                return SaslStep(server.first(payload))
            session.sasl = None  # an exchange is used once, whatever happens
            server_final = server.final(payload)
        except (AuthenticationFailed, ValueError) as exc:  # ValueError: a bug's safety net
            session.sasl = None
            return self._failed(session, _reason(exc), counted=True)
        return self._succeeded(session, server.username, server_final)

    async def _plain(self, session: Session, payload: bytes) -> SaslStep:
        if not session.tls:
            return self._failed(
                session,
                f"{PLAIN_MECHANISM} sends the password itself: it is offered only over TLS; "
                f"use {MECHANISM}",
                counted=False,
            )
        assert self.users is not None  # sasl_step() checked
        try:
            user, password = parse_plain(payload)
        except AuthenticationFailed as exc:
            return self._failed(session, _reason(exc), counted=True)
        credential = self.users.credential(user)
        known = credential is not None
        if credential is None:  # the same work for an unknown user: no user enumeration
            credential = await self._decoy_credential()
        ok = await _thread_bridge.run_in_thread(verify_password, credential, password)
        if not (ok and known):
            return self._failed(session, "authentication failed", counted=True)
        return self._succeeded(session, user, b"")

    async def _decoy_credential(self) -> ScramCredential:
        if self._decoy is None:
            self._decoy = await _thread_bridge.run_in_thread(derive_credential, "decoy")
        return self._decoy

    def _succeeded(self, session: Session, user: str, server_final: bytes) -> SaslStep:
        self.limiter.succeeded(session.address)
        session.principal = user_principal(user)
        log.info(
            "broker %d: %s authenticated from %s", self._broker_id, session.principal,
            session.address or "?",
        )  # fmt: skip
        return SaslStep(server_final, user=user)

    def _failed(self, session: Session, why: str, *, counted: bool) -> SaslStep:
        """A failed step: ``why`` is safe to tell the client; ``counted``: a failure of the
        credentials, which counts toward the address's limit (a mechanism not offered, or an
        address refused unheard, does not)."""
        if counted:
            self.limiter.failed(session.address)
        self._metrics.auth_failed()
        log.info("broker %d: AUTH from %s failed: %s", self._broker_id, session.address or "?", why)
        return SaslStep(b"", failure=why)


@dataclass(frozen=True, slots=True)
class SaslStep:
    """What one SASL step answers: ``failure`` (why, safe to send; the exchange ended), or
    ``user`` (authenticated: ``data`` is the server's last message, maybe empty), or neither
    (``data`` is the challenge: the client sends the next step)."""

    data: bytes
    user: str | None = None
    failure: str | None = None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _reason(exc: Exception) -> str:
    """What a failure tells the client: ``AuthenticationFailed``'s text is safe to send (the
    same for a wrong password and an unknown user); anything else is only "malformed"."""
    if isinstance(exc, AuthenticationFailed):
        return str(exc) or "authentication failed"
    return "malformed SASL message"
