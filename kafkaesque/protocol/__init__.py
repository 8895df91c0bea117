"""Sans-I/O codecs: the telnet-friendly line protocol and MQTT 3.1.1 / 5.0."""
