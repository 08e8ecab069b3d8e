"""The approval request links the version's model card (orchestration/approval.py): the link comes with an
asset event, which anyone allowed to post one can write, so only this installation's own cards are shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.settings import Settings
from orchestration.approval import approval_body, trusted_card
from training.ledger import Decision

UI = "https://mlflow.example.internal"
CARD = f"{UI}/#/experiments/3/runs/0a1b2c/artifacts/model_card/index.html"


def _waiting() -> Decision:
    return Decision(
        "fraud-detector", "gate", "awaiting_approval", "AUC-PR 0.61 beats 0.58", "7", "6", "6",
        candidate_metrics={"auc_pr": 0.61}, champion_metrics={"auc_pr": 0.58},
    )  # fmt: skip


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path, mlflow_ui_url=UI)


def test_the_request_links_the_card_of_this_installations_mlflow(settings):
    body = approval_body(settings, _waiting(), CARD)
    assert f"**Read its model card first**: [{CARD}]({CARD})" in body


@pytest.mark.parametrize(
    "card",
    [
        "https://phish.example.com/#/experiments/3/runs/0a1b2c/artifacts/model_card/index.html",
        f"{UI}/#/experiments/3/runs/0a1b2c/artifacts/other.html",
        f"{UI}.evil.example/#/experiments/3/runs/x/artifacts/model_card/index.html",
        f"{CARD}) [click](https://phish.example.com",
        f"{CARD}\n**Approve now**",
        "javascript:alert(1)",
        12,
    ],
)
def test_a_card_link_elsewhere_or_breaking_the_markdown_is_not_shown(settings, card):
    assert trusted_card(settings, card) is None
    body = approval_body(settings, _waiting(), card)
    assert "phish" not in body and "javascript" not in body and "Approve now" not in body
    assert "not shown" in body


def test_in_the_local_profile_the_card_is_a_file_under_its_mlflow_folder(tmp_path):
    settings = Settings(home=tmp_path)
    card = f"{settings.mlflow_dir}/artifacts/1/abc/artifacts/model_card/index.html"
    assert trusted_card(settings, card) == card
    assert f"`{card}`" in approval_body(settings, _waiting(), card)
    assert trusted_card(settings, "/etc/passwd/model_card/index.html") is None
