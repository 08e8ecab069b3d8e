"""`mlops doctor`'s approval check: who may sign off a gate pass, from the settings alone."""

from __future__ import annotations

import pytest

from core.settings import ApprovalSettings, Settings
from mlops.doctor import Status, _approval


@pytest.mark.parametrize(
    ("approval", "status", "said"),
    [
        (ApprovalSettings(), Status.OK, "off"),
        (ApprovalSettings(enabled=True), Status.WARN, "no approvers group"),
        (ApprovalSettings(enabled=True, approvers=["risk-officer", "cro"]), Status.OK, "risk-officer, cro"),
    ],
    ids=["off", "on without approvers", "on with approvers"],
)
def test_the_approval_check_says_who_may_sign_off(approval, status, said):
    check = _approval(Settings(approval=approval))
    assert check.status is status and said in check.detail, check
    assert ("MLOPS_APPROVAL__APPROVERS" in check.fix) is (status is Status.WARN)


def test_an_empty_approver_name_is_refused_by_the_settings():
    with pytest.raises(ValueError, match="approvers"):
        ApprovalSettings(enabled=True, approvers=[""])
