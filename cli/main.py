"""Entry point of the ``kafkaesque`` command: parses arguments and runs one subcommand.

Errors are printed as one clear line on stderr with a non-zero exit status; a traceback means a
bug in Kafkaesque, not in the user's input.
"""

from __future__ import annotations

import argparse
import sys

from kafkaesque.client import KafkaesqueError

from . import broker, client_commands, cluster, demo, devices, jepsen, mqtt_bridge


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kafkaesque",
        description="A Raft-replicated, partitioned log broker.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    broker.add_parser(commands)
    cluster.add_parser(commands)
    demo.add_parser(commands)
    devices.add_parser(commands)
    client_commands.add_parsers(commands)
    jepsen.add_parser(commands)
    mqtt_bridge.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (
        demo.DemoError,
        devices.DevicesError,
        broker.BrokerCommandError,
        cluster.ClusterError,
        client_commands.ClientCommandError,
        jepsen.JepsenError,
        mqtt_bridge.MqttBridgeError,
        KafkaesqueError,
    ) as exc:
        print(f"kafkaesque {args.command}: {exc}", file=sys.stderr)
        return 1
    return result


if __name__ == "__main__":
    raise SystemExit(main())
