"""A promotion or rollback killed (SIGKILL, as an OOM kill or a lost node would) at each point of its
commit, in a child process against a SQLite MLflow registry and ledger: the next `mlops` operation finds
alias and history in agreement or finishes the move, and a rollback works afterwards. An alias moved by
hand is still refused, and a manual promotion is the way out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration import test_promotion as promotion
from training.ledger import champion_stack
from training.registry import (
    CHAMPION_ALIAS,
    KILL_AT_ENV,
    AliasMovedOutsideError,
    promote_manually,
    rollback,
)

REPO = Path(__file__).resolve().parents[2]
# test_promotion.py's fixtures (tiny torch models registered in a SQLite MLflow), used here by name
models, holdout, local_registry = promotion.models, promotion.holdout, promotion.local_registry
_gate, _log_and_register = promotion._gate, promotion._log_and_register

CHILD = textwrap.dedent(
    """
    import sys

    from training.ledger import Ledger
    from training.registry import ModelRegistry, promote_manually, promote_with_gate, rollback

    operation, tracking_uri, ledger_url, version = sys.argv[1:]
    registry, ledger = ModelRegistry(tracking_uri), Ledger(ledger_url)
    if operation == "gate":
        from tests.integration.test_promotion import POLICY
        from tests.model.tensors import make_split

        holdout = make_split(4_000, seed=3)
        promote_with_gate(registry, ledger, version, holdout.x, holdout.y.numpy(), POLICY)
    elif operation == "manual":
        promote_manually(registry, ledger, version, "crash test")
    else:
        rollback(registry, ledger, "crash test")
    """
)


def _killed_at(point: str, operation: str, registry, ledger, version: str) -> None:
    """Run the operation in a child process that kills itself at `point`; fail unless it died there."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, operation, registry.tracking_uri, ledger.url, version],
        cwd=REPO,
        env={**os.environ, KILL_AT_ENV: point},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == -signal.SIGKILL, (
        f"the child was to be killed at {point!r}, it exited {done.returncode}:\n{done.stderr[-3000:]}"
    )


def _agree(registry, ledger) -> str | None:
    """The champion, once alias and the history's replay are the same version (asserted)."""
    stack = champion_stack(ledger.history(registry.name))
    assert registry.champion() == (stack[-1] if stack else None)
    return registry.champion()


# (operation in the child, point it is killed at, whether its history row survives the kill)
CASES = [
    ("gate", "appended", False),
    ("gate", "committed", True),
    ("gate", "alias-moved", True),
    ("manual", "committed", True),
    ("rollback", "committed", True),
    ("rollback", "alias-moved", True),
]


@pytest.mark.parametrize(("operation", "point", "recorded"), CASES, ids=[f"{o}-{p}" for o, p, _ in CASES])
def test_a_killed_promotion_leaves_alias_and_history_that_a_rollback_reconciles(
    local_registry, models, operation, point, recorded
):
    registry, ledger, artifacts = local_registry
    untrained, weaker, good = (
        _log_and_register(registry.tracking_uri, artifacts, models[name])
        for name in ("untrained", "weaker", "good")
    )
    promote_manually(registry, ledger, untrained, "first")
    promote_manually(registry, ledger, weaker, "second")
    if operation == "rollback":  # champions u, w, g; the child rolls g back to w
        promote_manually(registry, ledger, good, "third")
        before, after, previous = good, weaker, untrained
    else:  # champions u, w; the child promotes g (the gate: g beats w by the margin)
        before, after, previous = weaker, good, weaker
    rows = len(ledger.history(registry.name))

    _killed_at(point, operation, registry, ledger, good)

    history = ledger.history(registry.name)
    assert len(history) == rows + recorded
    # The history never lags the alias: before the commit nothing moved; after it, the alias follows.
    assert registry.champion() == (after if point == "alias-moved" else before)
    champion = champion_stack(history)[-1]
    assert champion == (after if recorded else before)

    back = rollback(registry, ledger, "after the crash")  # reconciles first, then rolls back

    assert back.champion_before == champion
    assert back.champion_after == (previous if recorded else champion_stack(history)[-2])
    assert _agree(registry, ledger) == back.champion_after
    # and the next operation meets no leftover either
    again = promote_manually(registry, ledger, good, "and forward again")
    assert again.champion_before == back.champion_after
    assert _agree(registry, ledger) == good


def test_an_alias_moved_by_hand_is_refused_until_a_person_promotes(local_registry, models, holdout):
    registry, ledger, artifacts = local_registry
    untrained, weaker, good = (
        _log_and_register(registry.tracking_uri, artifacts, models[name])
        for name in ("untrained", "weaker", "good")
    )
    promote_manually(registry, ledger, untrained, "first")
    promote_manually(registry, ledger, weaker, "second")
    # a person points the alias at a version the history never made champion
    registry.client.set_registered_model_alias(registry.name, CHAMPION_ALIAS, good)

    with pytest.raises(AliasMovedOutsideError, match=f"points at v{good} but the history says v{weaker}"):
        rollback(registry, ledger)
    with pytest.raises(AliasMovedOutsideError, match="moved outside"):
        _gate(registry, ledger, good, holdout)
    assert registry.champion() == good  # not moved back over the person's decision
    assert len(ledger.history(registry.name)) == 2

    settled = promote_manually(registry, ledger, good, "the hand move, made official")
    assert settled.champion_before == good
    assert f"the alias was at v{good} outside mlops; the history said v{weaker}" in settled.reason
    assert _agree(registry, ledger) == good
    back = rollback(registry, ledger)
    assert (back.champion_before, back.champion_after) == (good, weaker)
    assert _agree(registry, ledger) == weaker
