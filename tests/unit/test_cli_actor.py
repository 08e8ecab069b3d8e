"""The actor a champion move records (`mlops promote|rollback|retrain --actor`): a name that fits the
promotion history's column and prints, refused before anything runs otherwise."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mlops.cli import MAX_ACTOR, app


@pytest.mark.parametrize(
    "actor", ["x" * (MAX_ACTOR + 1), "ops\nlead", "ops\x1b[2Jlead"], ids=["too long", "newline", "escape"]
)
@pytest.mark.parametrize("command", [["rollback"], ["promote", "--version", "1", "--reason", "r"]])
def test_an_actor_that_does_not_fit_or_print_is_refused_before_anything_runs(command, actor):
    done = CliRunner().invoke(app, [*command, "--actor", actor])
    assert done.exit_code == 2, done.output
    assert "--actor" in done.output and f"at most {MAX_ACTOR} printable characters" in done.output
