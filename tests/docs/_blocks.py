"""The fenced code blocks of the docs, and the commands in them (pure: text in, blocks out).

A block tagged ``sh`` (or ``bash``, ``shell``) is a shell script: each of its
logical lines (backslash continuations joined, a trailing ``# comment`` dropped, a heredoc's body
kept with the line that opens it) is one command. A block whose first line starts with
``$ telnet`` is a telnet transcript: typed commands and the broker's replies. Any other block is
not run; an untagged one whose lines look like shell commands is an error (it should be tagged
``sh`` to be run, or ``text`` if it is not meant to be).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SHELL_TAGS = frozenset({"sh", "bash", "shell"})

# What the first word of a shell command looks like in these docs: a program a reader would type.
_SHELL_START = re.compile(
    r"^\s*(\$\s+)?("
    r"kafkaesque|bin/|\.venv/bin/|\./|mosquitto|python3?\b|pip\b|telnet\b|nc\b|seq\b|curl\b|"
    r"spark-submit|printf\b|echo\b|cat\b|sleep\b|wait\b|export\b|cd\b|sudo\b|apt(-get)?\b"
    r")"
)
_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
_HEREDOC = re.compile(r"(?<!<)<<(?!<)-?\s*(['\"]?)(\w+)\1")  # `<<<` is a here-string, no heredoc


@dataclass(frozen=True)
class Block:
    """One fenced code block: ``line`` is the 1-based line of its first content line."""

    path: str  # relative to the repository root, e.g. "docs/protocol.md"
    line: int
    tag: str  # "" when untagged
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def is_shell(self) -> bool:
        return self.tag.lower() in SHELL_TAGS

    @property
    def is_transcript(self) -> bool:
        return bool(self.lines) and self.lines[0].startswith("$ telnet")

    def looks_like_shell(self) -> bool:
        """An untagged block whose command-looking lines suggest it is meant to be typed."""
        content = [ln for ln in self.lines if ln.strip() and not ln.lstrip().startswith("#")]
        return bool(content) and any(_SHELL_START.match(ln) for ln in content)


@dataclass(frozen=True)
class Command:
    """One logical shell command of a block; ``line`` is where it starts in the file."""

    path: str
    line: int
    text: str  # continuations joined, comment stripped; a heredoc keeps its body and end line

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def read_blocks(root: Path, relpath: str) -> list[Block]:
    """Every fenced block of ``root/relpath``, in order."""
    text = (root / relpath).read_text(encoding="utf-8")
    return parse_blocks(relpath, text)


def parse_blocks(path: str, text: str) -> list[Block]:
    """The fenced blocks of a Markdown text (``` or ~~~ fences, closed by the same fence)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, tag = match.groups()
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: the code block is never closed")
        body = tuple(ln[len(indent) :] if ln.startswith(indent) else ln for ln in lines[start:j])
        blocks.append(Block(path, start + 1, tag, body))
        i = j + 1
    return blocks


def commands(block: Block) -> list[Command]:
    """The logical commands of a shell block (blank and comment-only lines skipped)."""
    result: list[Command] = []
    i = 0
    lines = block.lines
    while i < len(lines):
        first = i
        parts = [lines[i]]
        while parts[-1].endswith("\\") and i + 1 < len(lines):
            parts[-1] = parts[-1][:-1].rstrip()
            i += 1
            parts.append(lines[i].strip())
        text = strip_comment(" ".join(parts)).strip()
        i += 1
        end = _heredoc_end(text)
        if end is not None:
            body: list[str] = []
            while i < len(lines) and lines[i].strip() != end:
                body.append(lines[i])
                i += 1
            if i == len(lines):
                raise ValueError(f"{block.path}:{block.line + first}: heredoc never ends ({end})")
            i += 1
            text = "\n".join([text, *body, end])
        if text:
            result.append(Command(block.path, block.line + first, text))
    return result


def strip_comment(line: str) -> str:
    """``line`` without a trailing shell comment: a ``#`` that starts a word, outside quotes."""
    quote = ""
    escaped = False
    for k, ch in enumerate(line):
        if escaped:
            escaped = False
        elif ch == "\\" and quote != "'":
            escaped = True
        elif quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or line[k - 1] in " \t"):
            return line[:k].rstrip()
    return line


def _heredoc_end(text: str) -> str | None:
    """The terminator word of a heredoc the command opens (``<<'EOF'``), or None."""
    match = _HEREDOC.search(text)
    return match.group(2) if match else None
