"""Run `uv pip install ARGS...` with this machine's pip configuration (scripts/bootstrap.sh).

uv reads no pip configuration: the find-links that hold a CPU torch build, index URLs, constraints and the
CA bundle of a proxy are read here from `pip config list` (files and PIP_* variables, as pip would merge
them) and given to uv as arguments and environment. A local index or folder that does not exist is left out
(pip only warns of one; uv would fail).

    python scripts/uv_install.py UV [--without-find-links] [uv pip install arguments...]

--without-find-links leaves pip's find-links out: the training image's CUDA build must not take the CPU
build of torch a machine keeps there (requirements-gpu.lock names the CUDA one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# pip's key -> uv's option; each value of a key may name several, separated by spaces.
OPTIONS = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}


def pip_settings() -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    )
    return parse_pip_config(done.stdout)


def parse_pip_config(listing: str) -> dict[str, str]:
    """The settings in `pip config list`'s output (`variant.key='value'` lines), by key: an environment
    variable's (`:env:`) wins over a file's, as in pip; among files, the last one listed wins."""
    settings: dict[str, str] = {}
    from_env: set[str] = set()
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        variant, _, key = name.partition(".")
        if not key or (key in from_env and variant != ":env:"):
            continue
        settings[key] = value.strip().strip("'\"")
        if variant == ":env:":
            from_env.add(key)
    return settings


def _exists(location: str) -> bool:
    if "://" not in location:
        return Path(location).exists()
    if location.startswith("file://"):
        return Path(location.removeprefix("file://")).exists()
    return True


def uv_arguments(settings: dict[str, str], find_links: bool = True) -> tuple[list[str], dict[str, str]]:
    # pip takes the best match across every index it is given; uv, by default, only the first index that
    # has the package at all (a local mirror holding other versions of it would then fail the install).
    args: list[str] = ["--index-strategy", "unsafe-best-match"]
    for key, option in OPTIONS.items():
        if key == "find-links" and not find_links:
            continue
        for value in settings.get(key, "").split():
            if _exists(value):
                args += [option, value]
    env: dict[str, str] = {}
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings["default-timeout"]
    return args, env


def main(argv: list[str]) -> int:
    uv, *rest = argv
    find_links = "--without-find-links" not in rest
    rest = [argument for argument in rest if argument != "--without-find-links"]
    args, env = uv_arguments(pip_settings(), find_links)
    return subprocess.run([uv, "pip", "install", *args, *rest], env={**os.environ, **env}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
