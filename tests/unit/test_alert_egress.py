"""orchestration/alert_egress.py: the alert channels read from the settings, and the egress rules rendered
for them (the policies' effect on pods is tested against the rendered manifests in
tests/integration/test_infra_k8s.py). Names resolve through a resolver given here, addresses as written."""

from __future__ import annotations

import pytest

from core.settings import AlertSettings
from orchestration.alert_egress import (
    SENDERS,
    AlertEgressError,
    Channel,
    channel_networks,
    channels,
    egress_policies,
    resolve,
)

pytestmark = pytest.mark.unit


def _resolver(table: dict[str, list[str]]):
    def lookup(host: str) -> list[str]:
        if host not in table:
            raise OSError(f"[Errno -2] Name or service not known: {host}")
        return table[host]

    return lookup


def test_mail_is_a_channel_only_with_addresses_to_mail_and_the_webhook_port_follows_its_scheme():
    assert channels(AlertSettings()) == []
    assert channels(AlertSettings(smtp_host="relay.example.com")) == []  # no address to mail: never used
    mail = AlertSettings(email_to=["ops@example.com"], smtp_host="relay.example.com", smtp_port=587)
    assert channels(mail) == [Channel("mail", "MLOPS_ALERTS__SMTP_HOST", "relay.example.com", 587)]
    for url, port in [
        ("https://hooks.example.com/x", 443),
        ("http://hooks.example.com/x", 80),
        ("https://hooks.example.com:8443/x", 8443),
        ("http://[2001:db8::7]:9000/x", 9000),
    ]:
        (webhook,) = channels(AlertSettings(webhook_url=url))
        assert (webhook.kind, webhook.port) == ("webhook", port), url
    assert channels(AlertSettings(webhook_url="http://[2001:db8::7]:9000/x"))[0].host == "2001:db8::7"


def test_a_name_becomes_each_address_it_resolves_to_and_an_address_is_taken_as_written():
    lookup = _resolver({"relay.example.com": ["192.0.2.25", "2001:db8::25", "192.0.2.25"]})
    relay = Channel("mail", "MLOPS_ALERTS__SMTP_HOST", "relay.example.com", 587)
    assert channel_networks(relay, lookup) == ["192.0.2.25/32", "2001:db8::25/128"]
    literal = Channel("webhook", "MLOPS_ALERTS__WEBHOOK_URL", "198.51.100.7", 443)
    assert channel_networks(literal, _resolver({})) == ["198.51.100.7/32"]  # no lookup for an address
    assert "127.0.0.1" in resolve("localhost")  # the real resolver, on a name every machine has


@pytest.mark.parametrize(
    ("host", "table", "says"),
    [
        ("relay.nowhere.invalid", {}, "does not resolve here"),
        ("169.254.169.254", {}, "cloud metadata address"),
        ("metadata.internal", {"metadata.internal": ["169.254.169.254"]}, "cloud metadata address"),
        ("both.example.com", {"both.example.com": ["192.0.2.1", "fd00:ec2::254"]}, "cloud metadata address"),
    ],
)
def test_a_channel_that_cannot_be_admitted_is_refused_naming_its_setting(host, table, says):
    channel = Channel("mail", "MLOPS_ALERTS__SMTP_HOST", host, 587)
    with pytest.raises(AlertEgressError, match=says) as refused:
        channel_networks(channel, _resolver(table))
    assert "MLOPS_ALERTS__SMTP_HOST" in str(refused.value) and host in str(refused.value)


def test_one_policy_per_sending_namespace_with_one_rule_per_channel_and_none_without_channels():
    assert egress_policies(AlertSettings()) == []
    alerts = AlertSettings(
        email_to=["ops@example.com"], smtp_host="relay.example.com", smtp_port=587,
        webhook_url="https://198.51.100.7:8443/hooks",
    )  # fmt: skip
    policies = egress_policies(alerts, resolver=_resolver({"relay.example.com": ["192.0.2.25"]}))
    assert [(p["metadata"]["namespace"], p["spec"]["podSelector"]["matchLabels"]) for p in policies] == [
        (sender.namespace, sender.labels) for sender in SENDERS
    ]
    for policy in policies:
        assert policy["spec"]["policyTypes"] == ["Egress"]
        assert policy["spec"]["egress"] == [
            {"to": [{"ipBlock": {"cidr": "192.0.2.25/32"}}], "ports": [{"protocol": "TCP", "port": 587}]},
            {"to": [{"ipBlock": {"cidr": "198.51.100.7/32"}}], "ports": [{"protocol": "TCP", "port": 8443}]},
        ]
        assert "relay.example.com:587" in policy["metadata"]["annotations"]["mlops/alert-channels"]
    # With --any-address no name is looked up, and the metadata ranges stay shut.
    anywhere = egress_policies(alerts, any_address=True, resolver=_resolver({}))
    (first, second) = anywhere[0]["spec"]["egress"]
    assert first["to"][0]["ipBlock"] == {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}
    assert second["ports"] == [{"protocol": "TCP", "port": 8443}]
