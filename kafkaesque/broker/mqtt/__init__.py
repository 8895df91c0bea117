"""The broker's MQTT wing: devices connect to any broker, publish into the log, subscribe.

``MqttService`` (``_listener``) accepts the MQTT connections of one broker and runs each with an
``MqttDevice`` (``_device``); ``Admission`` checks their credentials and ACL, ``SessionKeeper``
(``_session_keeper``) keeps their sessions, ``Ingress`` appends their PUBLISHes to the log, and
``Egress`` delivers the records of mapped log topics to subscribed devices; retained messages
and persistent sessions are compacted internal topics every broker follows (``_retained``,
``_sessions``, ``_tail``). The broker builds it with ``MqttWiring``, the parts of the broker it
uses (no back-reference). The protocol itself, without I/O, is ``kafkaesque.protocol.mqtt``.
"""

from ._listener import MqttService
from ._wiring import MqttWiring

__all__ = ["MqttService", "MqttWiring"]
