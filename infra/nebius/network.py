"""Network: the subnet the cluster lives in (existing or new) and the login node's public IP."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_nebius as nebius


@dataclass
class NetworkArgs:
    parent_id: pulumi.Input[str]
    """Nebius project id."""
    name: str
    """Prefix for the names of created resources."""
    subnet_id: str | None
    """Existing subnet to look up; None creates one in ``network_id``."""
    network_id: str | None
    """VPC network for a new subnet (with the network's own address pools)."""


def login_address(cidr: str | None) -> str | None:
    """The address part of an allocation's CIDR (``203.0.113.7/32`` -> ``203.0.113.7``)."""
    return cidr.split("/", 1)[0] if cidr else None


class Network(pulumi.ComponentResource):
    """Subnet lookup or creation, plus a public ``VpcV1Allocation`` for the login LoadBalancer."""

    subnet_id: pulumi.Output[str]
    login_allocation_id: pulumi.Output[str]
    login_address: pulumi.Output[str | None]

    def __init__(self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:nebius:Network", name, None, opts)
        self.subnet_id = self._subnet(name, args)
        allocation = nebius.VpcV1Allocation(
            f"{name}-login-ip",
            parent_id=args.parent_id,
            name=f"{args.name}-login",
            ipv4_public=nebius.VpcV1AllocationIpv4PublicArgs(subnet_id=self.subnet_id),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.login_allocation_id = allocation.id
        self.login_address = allocation.status.apply(
            lambda s: login_address(s.details.allocated_cidr if s and s.details else None)
        )
        self.register_outputs({
            "subnet_id": self.subnet_id,
            "login_allocation_id": self.login_allocation_id,
            "login_address": self.login_address,
        })

    def _subnet(self, name: str, args: NetworkArgs) -> pulumi.Output[str]:
        if args.subnet_id is not None:
            found = nebius.get_vpc_v1_subnet_output(
                id=args.subnet_id, opts=pulumi.InvokeOutputOptions(parent=self)
            )
            return found.id
        subnet = nebius.VpcV1Subnet(
            f"{name}-subnet",
            parent_id=args.parent_id,
            name=f"{args.name}-subnet",
            network_id=args.network_id,
            ipv4_private_pools=nebius.VpcV1SubnetIpv4PrivatePoolsArgs(use_network_pools=True),
            opts=pulumi.ResourceOptions(parent=self),
        )
        return subnet.id
