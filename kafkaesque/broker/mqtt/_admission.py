"""Admission of MQTT devices: who may connect (the users file), and what each may do (the ACL).

``--mqtt-users`` names a users file of salted SCRAM-SHA-256 credentials (the format of
``--users-file``, so one file may serve both; ``kafkaesque user add``; the old ``user:password``
format is refused with the command that converts it); without it devices connect anonymously.
A device's password is checked off the event loop (PBKDF2 takes milliseconds on purpose); an
address that failed ``auth_failure_limit`` times within ``auth_failure_window_s`` gets CONNACK
"not authorized" without a check. The file is read again when it changes. ``--mqtt-acl-file``
(mosquitto's ``acl_file``, ``kafkaesque.security.MqttAcl``) says what each device may publish,
subscribe to and receive; refusals are logged at INFO and counted in /metrics.
"""

from __future__ import annotations

import logging
import os

from kafkaesque.protocol.mqtt import Accepted, Action
from kafkaesque.security import (
    FailureLimiter,
    MqttAcl,
    MqttAclError,
    ScramCredential,
    UsersFileError,
    UserStore,
    derive_credential,
    verify_password,
)

from .._config import ConfigError
from .._thread_bridge import run_in_thread
from ._device import MqttDevice
from ._wiring import MqttWiring

log = logging.getLogger("kafkaesque.broker.mqtt")


def load_users(path: str | None) -> UserStore | None:
    """The salted users file ``path`` (reloaded when it changes); None without a file.
    ``ConfigError`` for a file that cannot be read or has a bad line (a plaintext one too)."""
    if path is None:
        return None
    try:
        os.stat(path)
    except OSError as exc:
        raise ConfigError(f"mqtt_users: cannot read {path}: {exc}") from exc
    try:
        return UserStore(path)
    except UsersFileError as exc:
        raise ConfigError(f"mqtt_users: {exc}") from exc


def load_acl(path: str | None) -> MqttAcl | None:
    """The ACL file ``path`` (mosquitto's ``acl_file``); None without one."""
    if path is None:
        return None
    try:
        return MqttAcl.load(path)
    except MqttAclError as exc:
        raise ConfigError(f"mqtt_acl_file: {exc}") from exc


def check_password(
    credential: ScramCredential | None, decoy: ScramCredential, password: bytes | None
) -> bool:
    """Whether ``password`` is ``credential``'s (None: an unknown user, checked against
    ``decoy`` all the same, so that the time taken does not tell which users exist). Slow on
    purpose: call it in a worker thread."""
    try:
        text = (password or b"").decode()
    except UnicodeDecodeError:
        text = ""
    matches = verify_password(credential or decoy, text)
    return matches and credential is not None and password is not None


class Admission:
    """The credentials and ACL checks of one broker's MQTT service. Trio thread only.

    ``users`` and ``acl`` are None when the broker has none (anonymous devices, everything
    allowed); ``stats`` is the service's counters, of which this counts ``auth_failures``.
    """

    def __init__(self, wiring: MqttWiring, stats: dict[str, int]) -> None:
        config = wiring.config
        self._wiring = wiring
        self._stats = stats
        self.users = load_users(config.mqtt_users)
        self.acl = load_acl(config.mqtt_acl_file)
        self._limiter = FailureLimiter(config.auth_failure_limit, config.auth_failure_window_s)
        # An unknown user's password is checked against this, as long as a known one's.
        self._decoy = derive_credential(os.urandom(16).hex()) if self.users is not None else None

    async def admit(self, device: MqttDevice, accepted: Accepted) -> list[Action] | None:
        """Check the credentials of a CONNECT the state machine accepted; the actions that
        refuse it, or None to go on. Every failure is logged, counted and held against the
        device's address (``FailureLimiter``)."""
        users = self.users
        if users is None:
            return None
        assert self._decoy is not None and accepted.username is not None
        address = device.address
        who = f"mqtt {accepted.client_id} (user {accepted.username!r}, from {address})"
        if self._limiter.blocked(address) > 0:
            self._stats["auth_failures"] += 1
            log.info("%s: refused, too many authentication failures from its address", who)
            self._wiring.login_refused(
                f"broker {self._wiring.config.id} refused {who}: too many failures"
            )
            return device.conn.not_authorized()
        credential = users.credential(accepted.username)
        if await run_in_thread(check_password, credential, self._decoy, accepted.password):
            self._limiter.succeeded(address)
            return None
        self._limiter.failed(address)
        self._stats["auth_failures"] += 1
        log.info("%s: wrong user name or password", who)
        self._wiring.login_refused(
            f"broker {self._wiring.config.id} refused {who}: wrong user name or password"
        )
        return device.conn.bad_credentials()

    def refused(self, device: MqttDevice, action: str, topic: str) -> None:
        """The ACL refused ``action`` (publish, subscribe, receive, will) on ``topic``."""
        log.info(
            "mqtt %s (user %r, from %s): %s %r not authorized by the ACL",
            device.client_id,
            device.username,
            device.address,
            action,
            topic,
        )
        self._wiring.authorization_failed(action)
