"""Broker settings from flags and TOML files: Kafka's ``id@host:port`` lists, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafkaesque.broker import Address, ConfigError, config_from_mapping, load_config

BASE = {
    "id": 1,
    "data_dir": "data",
    "client": "127.0.0.1:9102",
    "peers": "0@127.0.0.1:9093,1@127.0.0.1:9103",
    "controllers": "0@127.0.0.1:9094,1@127.0.0.1:9104",
}


def test_flags_become_a_config() -> None:
    config = config_from_mapping({**BASE, "admin": "0.0.0.0:9105", "max_payload": 1024})
    assert config.client == Address("127.0.0.1", 9102)
    assert config.peers[0] == Address("127.0.0.1", 9093)
    assert config.admin == Address("0.0.0.0", 9105)
    assert config.limits.max_payload == 1024
    assert config.broker_dir.endswith("data/1")


def test_a_toml_file_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(
        "\n".join(f'{k} = "{v}"' if isinstance(v, str) else f"{k} = {v}" for k, v in BASE.items())
    )
    config = load_config(str(path), {"client": "127.0.0.1:1"})
    assert config.client.port == 1 and config.id == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"peers": "0@127.0.0.1:9093"}, "itself is not listed"),
        ({"peers": "0@127.0.0.1:9093,0@127.0.0.1:9193"}, "listed twice"),
        ({"client": "nowhere"}, "host:port"),
        ({"controllers": "1=127.0.0.1:9104"}, "id@host:port"),
        ({"colour": "blue"}, "unknown settings: colour"),
        ({"id": None}, "missing setting: id"),
    ],
)
def test_bad_settings_are_named(change: dict[str, object], message: str) -> None:
    raw = {**BASE, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError, match=message):
        config_from_mapping(raw)


def test_a_tls_listener_needs_a_certificate() -> None:
    with pytest.raises(ConfigError, match="mqtt_tls needs mqtt_tls_cert"):
        config_from_mapping({**BASE, "mqtt_tls": "127.0.0.1:8883"})
    config = config_from_mapping({**BASE, "mqtt_tls": "127.0.0.1:8883", "mqtt_tls_cert": "b.pem"})
    assert config.mqtt_tls == Address("127.0.0.1", 8883) and config.mqtt_enabled


def test_certificates_that_cannot_be_loaded_are_a_clear_error(tmp_path: Path) -> None:
    from kafkaesque.broker.mqtt._listener import load_tls

    bad = tmp_path / "broker.pem"
    bad.write_text("not a certificate")
    for cert in (str(bad), str(tmp_path / "missing.pem")):
        config = config_from_mapping({**BASE, "mqtt_tls": "127.0.0.1:8883", "mqtt_tls_cert": cert})
        with pytest.raises(ConfigError, match="mqtt_tls: cannot load the certificates"):
            load_tls(config)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("auth_failure_limit", -1, "auth_failure_limit must be a whole number >= 0"),
        ("auth_failure_limit", 2.5, "auth_failure_limit must be a whole number >= 0"),
        ("auth_failure_window_s", 0, "auth_failure_window_s must be a number > 0"),
    ],
)
def test_the_login_failure_limit_is_checked(setting: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_mapping({**BASE, setting: value})
