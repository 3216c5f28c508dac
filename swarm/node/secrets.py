"""Where a node's secrets come from: the swarm secret (peers) and the API key (clients).

Each is looked up in this order, and the first one found wins:
    1. the command line (`--secret`, `--api-key`)
    2. the environment ($SWARM_SECRET, $SWARM_API_KEY)
    3. a file in the state dir (`secret`, `api-key`), e.g. written by `swarm-node --new-secret`
None found: the swarm is open to anyone on the network (said loudly everywhere). A swarm with
a secret and no API key gets one derived from the secret (`swarm-node --print-api-key` prints
it): a closed swarm's API is closed too. An open swarm without a key takes requests from anyone.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .. import environment

SECRET_ENV, API_KEY_ENV = environment.SECRET.name, environment.API_KEY.name
SECRET_FILE, API_KEY_FILE = "secret", "api-key"
API_KEY_FROM_SECRET = "the swarm secret"  # a derived key's source
_API_KEY_LABEL = b"swarm api key v1"
_SECRET_ALPHABET = string.ascii_letters + string.digits  # 62 ** 43 > 2 ** 256


@dataclass(frozen=True)
class Secret:
    value: str | None
    source: str  # where it came from, for the log ("--secret", "$SWARM_SECRET", a path), or "none"

    def __bool__(self) -> bool:
        return bool(self.value)


def _choose(flag: str | None, flag_name: str, env: Mapping[str, str], env_name: str, path: Path) -> Secret:
    if flag:
        return Secret(flag, flag_name)
    if env.get(env_name):
        return Secret(env[env_name], f"${env_name}")
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        return Secret(None, "none")
    if not text:
        raise ValueError(f"{path} is empty; delete it or put the secret in it")
    return Secret(text, str(path))


def swarm_secret(flag: str | None, state_dir: Path, env: Mapping[str, str] = os.environ) -> Secret:
    return _choose(flag, "--secret", env, SECRET_ENV, Path(state_dir) / SECRET_FILE)


def api_key(flag: str | None, state_dir: Path, env: Mapping[str, str] = os.environ) -> Secret:
    return _choose(flag, "--api-key", env, API_KEY_ENV, Path(state_dir) / API_KEY_FILE)


def api_key_from_secret(stretched: bytes) -> str:
    """The API key of a swarm with a secret and no key of its own.

    From the stretched secret (link_crypto.stretch_secret), never the secret itself: a client
    holds the key, and a key must not let anyone test guesses of a passphrase quickly, nor
    join the swarm as a peer."""
    digest = hmac.new(stretched, _API_KEY_LABEL, hashlib.sha256).digest()
    return "sk-swarm-" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def effective_api_key(explicit: Secret, stretched: bytes | None) -> Secret:
    """The key clients need: the one given, else one derived from the swarm secret, else none."""
    if explicit or stretched is None:
        return explicit
    return Secret(api_key_from_secret(stretched), API_KEY_FROM_SECRET)


def new_secret_text() -> str:
    """256 random bits in letters and digits: pasted after `--secret` or into a file as it is
    (url-safe base64 may begin with "-", which a command line reads as an option)."""
    return "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(43))


def new_secret_file(state_dir: Path) -> tuple[Path, str]:
    """Write a fresh random swarm secret (readable by this user only); refuses to overwrite one."""
    path = Path(state_dir) / SECRET_FILE
    if path.exists():
        raise FileExistsError(f"{path} already holds a secret; delete it first to make a new one")
    text = new_secret_text()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as f:
        f.write(text + "\n")
    return path, text


def readable_by_others(path: Path) -> bool:
    try:
        return bool(path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO))
    except OSError:
        return False
