"""Where alerts leave the cluster: the host and port of each configured channel (core/settings.py
AlertSettings), read once here for the two things that need them: `mlops doctor`'s reachability check and the
NetworkPolicy egress rules `mlops alert-egress` renders for every pod that sends alerts.

A NetworkPolicy selects peers by address, never by name, so a channel's host is resolved when the policy is
rendered (an address in the setting is taken as written). Where a relay's or a webhook's addresses change
(a SaaS endpoint behind a CDN), `any_address` admits the channel's port to every address but the cloud
metadata endpoint instead; either way only the configured ports open.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from core.settings import AlertSettings
from orchestration.k8s_contract import (
    APP_LABEL,
    ORCHESTRATION_NAMESPACE,
    SERVING_NAMESPACE,
    TRAINING_APP,
    TRAINING_NAMESPACE,
)

POLICY_NAME = "alert-egress"
# The cloud providers' instance metadata endpoints: a channel never reaches them (a pod that could would
# borrow the node's cloud identity), whatever the setting says.
METADATA_NETWORKS = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fd00:ec2::/32"))


class AlertEgressError(ValueError):
    """A channel whose address cannot be put in a policy; the message names the setting and what to do."""


@dataclass(frozen=True)
class Channel:
    kind: str  # "mail" or "webhook"
    setting: str  # the environment variable that names the host
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.kind} {self.host}:{self.port} ({self.setting})"


@dataclass(frozen=True)
class Sender:
    """Pods that send alerts: where they run, the labels that select them, and which alerts they send."""

    namespace: str
    labels: dict[str, str]
    sends: str


SENDERS = (
    Sender(ORCHESTRATION_NAMESPACE, {"tier": "airflow"}, "Airflow's tasks: failures, approvals, label lag"),
    Sender(TRAINING_NAMESPACE, {APP_LABEL: TRAINING_APP}, "the monitor's check and the gate, run as pods"),
    Sender(SERVING_NAMESPACE, {APP_LABEL: "fraud-scoring"}, "the scoring service's objectives"),
)


def channels(alerts: AlertSettings) -> list[Channel]:
    """The channels alerts go out on: mail where there are addresses to mail, the webhook where one is set."""
    found = []
    if alerts.email_to and alerts.smtp_host:
        found.append(Channel("mail", "MLOPS_ALERTS__SMTP_HOST", alerts.smtp_host, alerts.smtp_port))
    if alerts.webhook_url:
        parsed = urlsplit(alerts.webhook_url)  # validated as an http(s) address with a host by the settings
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        found.append(Channel("webhook", "MLOPS_ALERTS__WEBHOOK_URL", parsed.hostname or "", port))
    return found


Resolver = Callable[[str], Sequence[str]]


def resolve(host: str) -> list[str]:
    """The addresses `host` resolves to here (both families), sorted and without repeats."""
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def channel_networks(channel: Channel, resolver: Resolver = resolve) -> list[str]:
    """The CIDRs (one address each) that `channel` reaches; refused, naming the setting, where the host does
    not resolve or lands on a cloud metadata endpoint."""
    try:
        addresses = [ipaddress.ip_address(channel.host)]
    except ValueError:
        try:
            addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(channel.host)]
        except OSError as exc:
            raise AlertEgressError(
                f"{channel.setting}: {channel.host!r} does not resolve here ({exc}); render where the "
                "cluster's names resolve, put the address in the setting, or pass --any-address to open the "
                "port to any address"
            ) from exc
    if not addresses:
        raise AlertEgressError(f"{channel.setting}: {channel.host!r} resolved to no address")
    for address in addresses:
        if any(address in network for network in METADATA_NETWORKS):
            raise AlertEgressError(
                f"{channel.setting}: {channel.host!r} is {address}, a cloud metadata address; an alert "
                "channel never goes there: correct the setting"
            )
    return sorted({f"{a}/{a.max_prefixlen}" for a in addresses})


def _any_address() -> list[dict[str, Any]]:
    return [
        {"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
        {"ipBlock": {"cidr": "::/0", "except": ["fd00:ec2::/32"]}},
    ]


def egress_rules(
    found: list[Channel], any_address: bool = False, resolver: Resolver = resolve
) -> list[dict[str, Any]]:
    """One egress rule per channel: its port (TCP) to its addresses, or to any address but the metadata's."""
    rules = []
    for channel in found:
        peers = _any_address() if any_address else [
            {"ipBlock": {"cidr": cidr}} for cidr in channel_networks(channel, resolver)
        ]  # fmt: skip
        rules.append({"to": peers, "ports": [{"protocol": "TCP", "port": channel.port}]})
    return rules


def egress_policies(
    alerts: AlertSettings, any_address: bool = False, resolver: Resolver = resolve
) -> list[dict[str, Any]]:
    """A NetworkPolicy `alert-egress` per namespace whose pods send alerts, admitting exactly the configured
    channels; none where no channel is configured. NetworkPolicies add up, so these open the channels beside
    infra/k8s/base/network-policies and the scoring chart's policy without editing them."""
    found = channels(alerts)
    if not found:
        return []
    rules = egress_rules(found, any_address, resolver)
    return [
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {
                "name": POLICY_NAME,
                "namespace": sender.namespace,
                "labels": {"app.kubernetes.io/part-of": "mlops", "app.kubernetes.io/component": "alerts"},
                "annotations": {
                    "mlops/alert-channels": ", ".join(str(c) for c in found),
                    "mlops/senders": sender.sends,
                },
            },
            "spec": {
                "podSelector": {"matchLabels": dict(sender.labels)},
                "policyTypes": ["Egress"],
                "egress": rules,
            },
        }
        for sender in SENDERS
    ]
