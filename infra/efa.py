"""EFA network-interface layout for a GPU launch template (pure logic, no Pulumi).

One interface per network card of the instance type. Card 0 carries the primary interface:
device index 0, type ``efa`` (EFA plus a normal ENA interface with an IP: kubelet and pod traffic).
Every other card gets device index 1 and type ``efa-only``: the EFA device without an IP address,
so a p5.48xlarge does not burn 31 extra VPC addresses per node and the VPC CNI never tries to put
pods on them. Layout and the efa-only choice: terraform-aws-eks `modules/eks-managed-node-group`
and pulumi-eks `nodes/instances.ts` (FIELD_NOTES §1). Device index 0 on a second card fails with
"device index exceeds the maximum" (eksctl#7520), hence index 1 there.
"""

from __future__ import annotations

from dataclasses import dataclass

PRIMARY_INTERFACE_TYPE = "efa"
SECONDARY_INTERFACE_TYPE = "efa-only"


@dataclass(frozen=True)
class EfaInterface:
    """One launch-template network interface of an EFA node."""

    network_card_index: int
    device_index: int
    interface_type: str


def efa_interfaces(network_cards: int) -> list[EfaInterface]:
    """The interfaces of an EFA node with ``network_cards`` cards (the catalog's ``networkCards``)."""
    if isinstance(network_cards, bool) or not isinstance(network_cards, int) or network_cards < 1:
        raise ValueError(f"network_cards must be an integer >= 1, got {network_cards!r}")
    return [
        EfaInterface(
            network_card_index=card,
            device_index=0 if card == 0 else 1,
            interface_type=PRIMARY_INTERFACE_TYPE if card == 0 else SECONDARY_INTERFACE_TYPE,
        )
        for card in range(network_cards)
    ]
