"""Mk8sCluster: the managed Kubernetes cluster and one node group per Slurm role or worker set."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_nebius as nebius

from infra.nebius.layout import NodeGroupSpec

NODE_OS = "ubuntu24.04"
"""Every node group's image OS, as the reference install sets it (nebius-solutions-library soperator/modules/k8s/
k8s_ng_system.tf at 78e87a44 and k8s_ng_workers_v2.tf at 339aa712: ``os = "ubuntu24.04"``)."""
WORKER_AUTO_REPAIR: tuple[tuple[str, str, str | None], ...] = (
    ("Ready", "FALSE", None),
    ("Ready", "UNKNOWN", None),
    ("NebiusBootDiskIOError", "TRUE", None),
    ("NebiusGPUError", "TRUE", None),
    ("NebiusContainerRuntimeError", "TRUE", None),
    ("HardwareIssuesSuspected", "TRUE", "1s"),
)
"""Worker node groups' auto-repair conditions (type, status, timeout; None: the platform's rule disabled), as the
reference's k8s_ng_workers_v2.tf at 339aa712 overrides them: mk8s does not repair a not-ready node, a failed boot
disk, GPU or container runtime by itself ("to avoid races with Soperator", whose checks drain and replace them), and
recreates at once a node Soperator marks ``HardwareIssuesSuspected``."""


@dataclass
class Mk8sClusterArgs:
    parent_id: pulumi.Input[str]
    """Nebius project id."""
    name: str
    """Cluster name; node groups are named after their role or worker set."""
    subnet_id: pulumi.Input[str]
    """Subnet of the control plane and of every node."""
    k8s_version: str
    """Control-plane and node version, e.g. ``1.31``."""
    public_endpoint: bool
    """Give the Kubernetes API a public address."""
    node_groups: list[NodeGroupSpec]
    """Node groups in creation order."""
    filesystem_ids: dict[str, pulumi.Input[str]]
    """Shared filesystem id per mount tag; each node group attaches the tags its spec lists."""


class Mk8sCluster(pulumi.ComponentResource):
    """``Mk8sV1Cluster`` with its ``Mk8sV1NodeGroup`` children; worker sets on an InfiniBand fabric
    get a ``ComputeV1GpuCluster``. GPU drivers come from the node image (``gpu_settings.drivers_preset``)
    or, for worker sets that ask for it, the NVIDIA GPU operator; a fabric adds the NVIDIA network
    operator (RDMA for NCCL). Both operators are Nebius applications, as in nebius-solutions-library."""

    cluster_id: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    ca_certificate: pulumi.Output[str]
    node_groups: dict[str, nebius.Mk8sV1NodeGroup]
    node_group_ids: dict[str, pulumi.Output[str]]
    gpu_cluster_ids: dict[str, pulumi.Output[str]]
    applications: dict[str, nebius.ApplicationsV1alpha1K8sRelease]

    def __init__(self, name: str, args: Mk8sClusterArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:nebius:Mk8sCluster", name, None, opts)
        cluster = self._cluster(name, args)
        self.cluster_id = cluster.id
        control_plane = cluster.status.apply(lambda s: s.control_plane if s else None)
        self.endpoint = control_plane.apply(
            lambda c: c.endpoints.public_endpoint or c.endpoints.private_endpoint if c and c.endpoints else ""
        )
        self.ca_certificate = control_plane.apply(lambda c: c.auth.cluster_ca_certificate if c and c.auth else "")
        self.gpu_cluster_ids = {
            spec.name: self._gpu_cluster(name, args, spec) for spec in args.node_groups if spec.fabric
        }
        self.node_groups = {spec.name: self._node_group(name, args, cluster, spec) for spec in args.node_groups}
        self.node_group_ids = {key: group.id for key, group in self.node_groups.items()}
        self.applications = self._applications(name, args, cluster)
        self.register_outputs({
            "cluster_id": self.cluster_id,
            "endpoint": self.endpoint,
            "node_group_ids": self.node_group_ids,
            "gpu_cluster_ids": self.gpu_cluster_ids,
        })

    def _cluster(self, name: str, args: Mk8sClusterArgs) -> nebius.Mk8sV1Cluster:
        endpoints = nebius.Mk8sV1ClusterControlPlaneEndpointsArgs(
            public_endpoint=nebius.Mk8sV1ClusterControlPlaneEndpointsPublicEndpointArgs()
        ) if args.public_endpoint else None
        return nebius.Mk8sV1Cluster(
            f"{name}-k8s",
            parent_id=args.parent_id,
            name=args.name,
            control_plane=nebius.Mk8sV1ClusterControlPlaneArgs(
                subnet_id=args.subnet_id, version=args.k8s_version, endpoints=endpoints, etcd_cluster_size=3
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _applications(
        self, name: str, args: Mk8sClusterArgs, cluster: nebius.Mk8sV1Cluster
    ) -> dict[str, nebius.ApplicationsV1alpha1K8sRelease]:
        wanted = {app: slug for app, slug, needed in (
            ("network-operator", "nebius/nvidia-network-operator", any(s.fabric for s in args.node_groups)),
            ("gpu-operator", "nebius/nvidia-gpu-operator", any(s.gpu_operator for s in args.node_groups)),
        ) if needed}
        apps: dict[str, nebius.ApplicationsV1alpha1K8sRelease] = {}
        for app, slug in wanted.items():
            after = [*self.node_groups.values(), *apps.values()]
            apps[app] = nebius.ApplicationsV1alpha1K8sRelease(
                f"{name}-{app}", parent_id=args.parent_id, cluster_id=cluster.id, application_name=app,
                namespace=app, product_slug=slug,
                opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            )
        return apps

    def _gpu_cluster(self, name: str, args: Mk8sClusterArgs, spec: NodeGroupSpec) -> pulumi.Output[str]:
        gpu_cluster = nebius.ComputeV1GpuCluster(
            f"{name}-{spec.name}-gpu-cluster",
            parent_id=args.parent_id,
            name=f"{args.name}-{spec.name}",
            infiniband_fabric=spec.fabric,
            opts=pulumi.ResourceOptions(parent=self),
        )
        return gpu_cluster.id

    def _node_group(
        self, name: str, args: Mk8sClusterArgs, cluster: nebius.Mk8sV1Cluster, spec: NodeGroupSpec
    ) -> nebius.Mk8sV1NodeGroup:
        autoscaling = (
            nebius.Mk8sV1NodeGroupAutoscalingArgs(min_node_count=spec.min_size, max_node_count=spec.max_size)
            if spec.fixed_size is None else None
        )
        return nebius.Mk8sV1NodeGroup(
            f"{name}-{spec.name}",
            parent_id=cluster.id,
            name=spec.name,
            version=args.k8s_version,
            fixed_node_count=spec.fixed_size,
            autoscaling=autoscaling,
            labels=spec.labels,
            auto_repair=worker_auto_repair() if spec.role == "worker" else None,
            template=self._template(args, spec),
            opts=pulumi.ResourceOptions(parent=cluster),
        )

    def _template(self, args: Mk8sClusterArgs, spec: NodeGroupSpec) -> nebius.Mk8sV1NodeGroupTemplateArgs:
        gpu_cluster = self.gpu_cluster_ids.get(spec.name)
        return nebius.Mk8sV1NodeGroupTemplateArgs(
            metadata=nebius.Mk8sV1NodeGroupTemplateMetadataArgs(labels=spec.labels),
            resources=nebius.Mk8sV1NodeGroupTemplateResourcesArgs(platform=spec.platform, preset=spec.preset),
            boot_disk=nebius.Mk8sV1NodeGroupTemplateBootDiskArgs(
                type=spec.boot_disk.type, size_gibibytes=spec.boot_disk.size_gib
            ),
            filesystems=[
                nebius.Mk8sV1NodeGroupTemplateFilesystemArgs(
                    attach_mode="READ_WRITE",
                    mount_tag=tag,
                    existing_filesystem=nebius.Mk8sV1NodeGroupTemplateFilesystemExistingFilesystemArgs(
                        id=args.filesystem_ids[tag]
                    ),
                )
                for tag in spec.mount_tags
            ],
            network_interfaces=[nebius.Mk8sV1NodeGroupTemplateNetworkInterfaceArgs(subnet_id=args.subnet_id)],
            taints=[
                nebius.Mk8sV1NodeGroupTemplateTaintArgs(key=t.key, value=t.value, effect=t.effect)
                for t in spec.taints
            ] or None,
            gpu_cluster=nebius.Mk8sV1NodeGroupTemplateGpuClusterArgs(id=gpu_cluster) if gpu_cluster else None,
            gpu_settings=nebius.Mk8sV1NodeGroupTemplateGpuSettingsArgs(drivers_preset=spec.drivers_preset)
            if spec.drivers_preset else None,
            preemptible=nebius.Mk8sV1NodeGroupTemplatePreemptibleArgs() if spec.preemptible else None,
            os=NODE_OS,
        )


def worker_auto_repair() -> nebius.Mk8sV1NodeGroupAutoRepairArgs:
    return nebius.Mk8sV1NodeGroupAutoRepairArgs(conditions=[
        nebius.Mk8sV1NodeGroupAutoRepairConditionArgs(type=kind, status=status, timeout=timeout)
        if timeout is not None else
        nebius.Mk8sV1NodeGroupAutoRepairConditionArgs(type=kind, status=status, disabled=True)
        for kind, status, timeout in WORKER_AUTO_REPAIR
    ])
