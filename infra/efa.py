"""EFA network-interface layout for a GPU launch template (pure logic, no Pulumi).

The layout is AWS's for maximum bandwidth on instances with several network cards (Amazon EC2 user
guide, "Maximize network bandwidth on Amazon EC2 instances with multiple network cards",
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html, read 2026-12-06; it is
also what its P5/P5e/P5en section builds on):

- the primary interface (network card 0, device index 0) is an ENA interface ("You can't use an
  EFA-only network interface as the primary network interface"): kubelet and pod traffic, one IP;
- card 0 also carries an EFA-only interface at device index 1;
- every other card carries an EFA-only interface at device index 0.

So every network card gets one EFA device (32 on p5.48xlarge, 16 on p5en.48xlarge) and none of them
takes a VPC address or is offered to the VPC CNI. The earlier layout (terraform-aws-eks: card 0
device 0 `efa`, other cards device 1) put EFA on the primary ENA interface and used device index 1
on cards whose device 0 stayed empty; AWS's guide is followed instead, and the tests in
tests/infra/test_compute_efa_iam.py hold the layout to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infra.catalog import Catalog
    from infra.config import NodeGroupConfig

PRIMARY_INTERFACE_TYPE = "interface"  # ENA (EC2 InterfaceType "interface")
EFA_INTERFACE_TYPE = "efa-only"


@dataclass(frozen=True)
class EfaInterface:
    """One launch-template network interface of an EFA node."""

    network_card_index: int
    device_index: int
    interface_type: str


def efa_interfaces(network_cards: int) -> list[EfaInterface]:
    """The interfaces of an EFA node with ``network_cards`` cards (the catalog's ``networkCards``):
    the primary ENA interface, then one EFA-only interface per card."""
    if isinstance(network_cards, bool) or not isinstance(network_cards, int) or network_cards < 1:
        raise ValueError(f"network_cards must be an integer >= 1, got {network_cards!r}")
    return [EfaInterface(network_card_index=0, device_index=0, interface_type=PRIMARY_INTERFACE_TYPE)] + [
        EfaInterface(network_card_index=card, device_index=1 if card == 0 else 0,
                     interface_type=EFA_INTERFACE_TYPE)
        for card in range(network_cards)
    ]


def efa_interface_count(group: NodeGroupConfig, catalog: Catalog) -> int:
    """EFA interfaces per node of a group (0 without EFA): one per network card of its first type;
    config validation made its types agree."""
    return catalog[group.instance_types[0]].efa_interfaces if group.efa else 0
