"""Write the simple auth manager's passwords file from the environment, before ``airflow api-server``.

Airflow's SimpleAuthManager keeps ``{"user": "password"}`` in the file named by
``AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE`` and only generates (and logs) a random
password for a user missing from it. Writing the file first makes the UI login the one in
``.env`` (``AIRFLOW_ADMIN_USERNAME`` / ``AIRFLOW_ADMIN_PASSWORD``), stable across restarts.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

USERS_VAR = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"
FILE_VAR = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
PASSWORD_VAR = "AIRFLOW_ADMIN_PASSWORD"


def usernames(users_setting: str) -> list[str]:
    """``"admin:admin,bob:viewer"`` -> ``["admin", "bob"]`` (the setting's user:role[:teams] format)."""
    return [entry.split(":", 1)[0].strip() for entry in users_setting.split(",") if entry.strip()]


def write_passwords(env: Mapping[str, str]) -> Path:
    """Give every configured user the password from ``AIRFLOW_ADMIN_PASSWORD``; return the file written."""
    password = env.get(PASSWORD_VAR, "")
    if not password:
        raise SystemExit(f"{PASSWORD_VAR} is empty: set it in .env (see infra/compose/README.md)")
    if not env.get(FILE_VAR):
        raise SystemExit(f"{FILE_VAR} is not set: the API server would not read the file this writes")
    names = usernames(env.get(USERS_VAR, "admin:admin"))
    if not names:
        raise SystemExit(f"{USERS_VAR} names no user")
    path = Path(env[FILE_VAR])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(dict.fromkeys(names, password)) + "\n")
    tmp.chmod(0o600)
    os.replace(tmp, path)
    return path


def main() -> int:
    path = write_passwords(os.environ)
    print(
        f"simple auth manager: passwords for {', '.join(usernames(os.environ.get(USERS_VAR, 'admin:admin')))} "
        f"written to {path}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
