"""commit-msg hook (pre-commit): the subject line stays within 72 characters, the detail
goes in the body after a blank line."""

from __future__ import annotations

import sys
from pathlib import Path

MAX_SUBJECT = 72


def main(argv: list[str]) -> int:
    lines = Path(argv[1]).read_text(encoding="utf-8").splitlines()
    text = [line for line in lines if not line.startswith("#")]
    subject = text[0] if text else ""
    if len(subject) > MAX_SUBJECT:
        print(
            f"commit subject is {len(subject)} characters (at most {MAX_SUBJECT}): "
            "shorten it and put the detail in the body, after a blank line",
            file=sys.stderr,
        )
        return 1
    if len(text) > 1 and text[1].strip():
        print("leave a blank line between the subject and the body", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
