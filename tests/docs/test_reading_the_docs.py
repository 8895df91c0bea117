"""How the doc tests read a doc: blocks, commands, transcripts, and the rewriting of ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs._blocks import Block, commands, parse_blocks, strip_comment
from tests.docs._rewrite import Rewriter
from tests.docs._transcript import parse

DOC = """# Title

```sh
bin/kafkaesque cluster up -n 3   # brokers 0..2
kafkaesque broker --id 0 \\
    --client 127.0.0.1:9092
cat > rules <<'EOF'
a -> b  # not a comment: heredoc text
EOF
echo x <<< 'y'
```

```
$ telnet 127.0.0.1 9092
Trying 127.0.0.1...
PING
+OK PONG
QUIT
+OK bye
Connection closed by foreign host.
```

~~~text
kafkaesque status
~~~
"""


def test_fenced_blocks_keep_their_tag_and_first_content_line() -> None:
    blocks = parse_blocks("doc.md", DOC)
    assert [(b.line, b.tag) for b in blocks] == [(4, "sh"), (14, ""), (24, "text")]
    assert blocks[0].is_shell and blocks[1].is_transcript
    assert not blocks[2].is_shell and not blocks[2].is_transcript


def test_shell_commands_join_continuations_drop_comments_and_keep_heredocs() -> None:
    found = commands(parse_blocks("doc.md", DOC)[0])
    assert [(c.line, c.text) for c in found] == [
        (4, "bin/kafkaesque cluster up -n 3"),
        (5, "kafkaesque broker --id 0 --client 127.0.0.1:9092"),
        (7, "cat > rules <<'EOF'\na -> b  # not a comment: heredoc text\nEOF"),
        (10, "echo x <<< 'y'"),
    ]
    assert found[0].where == "doc.md:4"


@pytest.mark.parametrize(
    ("line", "stripped"),
    [
        ("a b  # c", "a b"),
        ("a '#b' \"#c\" # d", "a '#b' \"#c\""),
        ("a#b", "a#b"),
        ("a \\# b", "a \\# b"),
        ("# all comment", ""),
    ],
)
def test_a_comment_starts_at_a_word_outside_quotes(line: str, stripped: str) -> None:
    assert strip_comment(line) == stripped


def test_untagged_command_lines_look_like_shell_and_diagrams_do_not() -> None:
    assert Block("d.md", 1, "", (".venv/bin/kafkaesque status",)).looks_like_shell()
    assert Block("d.md", 1, "", ("mosquitto_sub -t x",)).looks_like_shell()
    assert not Block("d.md", 1, "", ("+OK[ <text>]", "a -> b")).looks_like_shell()


def test_a_transcript_is_commands_with_their_replies_and_the_close() -> None:
    block = parse_blocks("doc.md", DOC)[1]
    transcript = parse(block.lines, block.line)
    assert (transcript.host, transcript.port) == ("127.0.0.1", 9092)
    assert [(s.line, s.command, s.replies) for s in transcript.steps] == [
        (16, "PING", ("+OK PONG",)),
        (18, "QUIT", ("+OK bye",)),
    ]
    assert transcript.closed_by_broker


def test_documented_ports_and_data_dirs_move_to_the_tests(tmp_path: Path) -> None:
    rewrite = Rewriter(21000, tmp_path)
    assert rewrite.port(9092) == 21000
    assert rewrite.port(9116) == 21024
    assert rewrite.port(9099) == 9099  # not a port of the documented cluster
    assert rewrite.port(1883) == 1883
    assert Rewriter(21000, tmp_path, upstream_mqtt=31883).port(1883) == 31883
    assert rewrite.command("mosquitto_sub -h 127.0.0.1 -p 9106 -t a") == (
        "mosquitto_sub -h 127.0.0.1 -p 21014 -t a"
    )
    assert rewrite.command("seq 1000 | kafkaesque produce t") == "seq 1000 | kafkaesque produce t"
    assert rewrite.command("bin/kafkaesque cluster up -n 3") == (
        f"bin/kafkaesque cluster up -n 3 --base-port 21000 --data-dir {tmp_path / 'cluster'}"
    )
    assert rewrite.command("kafkaesque cluster up --base-port 0 --data-dir /tmp/kq") == (
        f"kafkaesque cluster up --base-port 0 --data-dir {tmp_path / 'tmp_kq'}"
    )
    # devices finds the cluster's MQTT listeners itself: only the documented ports move
    assert rewrite.command("kafkaesque devices -n 2 --bootstrap 127.0.0.1:9092") == (
        "kafkaesque devices -n 2 --bootstrap 127.0.0.1:21000"
    )
    assert rewrite.command("kafkaesque devices --mqtt 127.0.0.1:9106") == (
        "kafkaesque devices --mqtt 127.0.0.1:21014"
    )
