"""scripts/uv_install.py hands pip's configuration to uv: the bootstrap must find the CPU torch build that
pip's find-links hold on a CPU machine, and must not fail on a local index that is not there."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def uv_install():
    spec = importlib.util.spec_from_file_location("uv_install", REPO / "scripts" / "uv_install.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_environment_variable_wins_over_every_file_and_a_later_file_over_an_earlier(uv_install):
    listing = "\n".join(
        [
            ":env:.find-links='/from/env'",
            "global.find-links='/from/global'",
            "global.index-url='https://global.example/simple'",
            "user.index-url='https://user.example/simple'",
            "global.cert='/etc/ssl/bundle.pem'",
        ]
    )
    assert uv_install.parse_pip_config(listing) == {
        "find-links": "/from/env",
        "index-url": "https://user.example/simple",
        "cert": "/etc/ssl/bundle.pem",
    }


def test_find_links_indexes_and_constraints_become_uv_options_and_missing_local_ones_are_left_out(
    uv_install, tmp_path
):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch<=2.14.1\n")
    settings = {
        "find-links": str(wheels),
        "extra-index-url": f"file://{tmp_path}/absent/simple https://mirror.example/simple",
        "constraint": str(constraints),
        "cert": "/etc/ssl/bundle.pem",
        "default-timeout": "180",
        "disable-pip-version-check": "1",
    }
    args, env = uv_install.uv_arguments(settings)
    assert args == [
        "--index-strategy",
        "unsafe-best-match",
        "--extra-index-url",
        "https://mirror.example/simple",
        "--find-links",
        str(wheels),
        "--constraint",
        str(constraints),
    ]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/bundle.pem", "UV_HTTP_TIMEOUT": "180"}


def test_the_cuda_build_leaves_the_find_links_out(uv_install, tmp_path):
    """The training image's CUDA variant (--without-find-links) must not take the CPU torch kept there."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    settings = {"find-links": str(wheels), "index-url": "https://mirror.example/simple"}
    args, _ = uv_install.uv_arguments(settings, find_links=False)
    assert "--find-links" not in args and "https://mirror.example/simple" in args
    assert "--find-links" in uv_install.uv_arguments(settings)[0]
