"""Write the repo root's ``.env`` from ``infra/compose/.env.example``, with every empty secret filled.

    python3 infra/compose/make_env.py [--force] [--output PATH]

Only the standard library, so it runs before any install. Each empty ``NAME=`` gets a fresh random
value (a Fernet key for ``AIRFLOW_FERNET_KEY``); everything else is copied as it is.
"""

from __future__ import annotations

import argparse
import base64
import os
import re
import secrets
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE / ".env.example"
REPO = HERE.parents[1]
ASSIGNMENT = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>.*)$")


def secret_for(name: str) -> str:
    if name == "AIRFLOW_FERNET_KEY":
        return base64.urlsafe_b64encode(os.urandom(32)).decode()
    return secrets.token_urlsafe(24)  # URL-safe: the Postgres password goes into a connection URL


def fill(example: str) -> str:
    lines = []
    for line in example.splitlines():
        match = ASSIGNMENT.match(line)
        empty = match and not match.group("value").strip()
        lines.append(f"{match.group('name')}={secret_for(match.group('name'))}" if empty else line)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, default=REPO / ".env")
    parser.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = parser.parse_args(argv)
    if args.output.exists() and not args.force:
        print(
            f"{args.output} exists; keeping it (use --force to replace it, which changes every secret)", file=sys.stderr
        )
        return 1
    # Secrets: the file is 0600 from its first byte (a temp file created so), and renamed into place whole.
    tmp = args.output.with_name(f".{args.output.name}.tmp-{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
        out.write(fill(EXAMPLE.read_text()))
    os.replace(tmp, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
