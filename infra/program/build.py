"""The Pulumi program: StackConfig in, components built in order, typed stack outputs out
(``documents.stack_outputs.StackOutputs``, flattened into Pulumi's keys by ``infra/__main__.py``)."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi

from documents.run_config import load_run_config
from documents.stack_outputs import ChatCost, Cost, Filesystem, NodeGroup, StackOutputs, flat_name
from documents.stack_outputs import Platform as PlatformOutputs
from infra.config import PROJECT, REPO_ROOT, SECRET_KEYS, StackConfig, load_run
from infra.cost.price import measured_plan, price_stack
from infra.monitoring.access import monitoring_access
from infra.nebius.backups import BackupAccess, BackupAccessArgs
from infra.nebius.buckets import Buckets, BucketsArgs
from infra.nebius.cluster import Mk8sCluster, Mk8sClusterArgs
from infra.nebius.filesystems import SharedFilesystems, SharedFilesystemsArgs
from infra.nebius.layout import Layout, layout
from infra.nebius.network import Network, NetworkArgs
from infra.pipeline.chain import code_hash, pipeline_jobs, code_location_for, run_root
from infra.environment.plan import environment_plan, environment_section
from infra.pipeline.component import Pipeline, PipelineArgs
from infra.pipeline.datasource import fingerprint_source
from infra.pipeline.transport import LocalTransport
from infra.nebius.object_storage import nebius_s3_endpoint
from infra.program.kubeconfig import kubeconfig
from infra.output_sections import stack_identity
from infra.runs.measured import price_inputs
from infra.soperator.component import Soperator, SoperatorArgs
from infra.soperator.values import BackupTarget, release_plan

PIPELINE_KEY_CONFIG = SECRET_KEYS[0]


@dataclass
class Platform:
    """The cloud components of a nebius stack."""

    network: Network
    filesystems: SharedFilesystems
    cluster: Mk8sCluster
    buckets: Buckets | None
    backup_access: BackupAccess | None
    soperator: Soperator
    kubeconfig: pulumi.Output[str]


def build_network(cfg: StackConfig) -> Network:
    assert cfg.nebius is not None
    return Network(f"{cfg.cluster_name}-net", NetworkArgs(
        parent_id=cfg.nebius.parent_id, name=cfg.cluster_name,
        subnet_id=cfg.nebius.subnet_id, network_id=cfg.nebius.network_id,
    ))


def build_filesystems(cfg: StackConfig, plan: Layout) -> SharedFilesystems:
    assert cfg.nebius is not None
    return SharedFilesystems(f"{cfg.cluster_name}-fs", SharedFilesystemsArgs(
        parent_id=cfg.nebius.parent_id, specs=list(plan.filesystems),
    ))


def build_cluster(cfg: StackConfig, plan: Layout, network: Network, filesystems: SharedFilesystems) -> Mk8sCluster:
    assert cfg.nebius is not None
    return Mk8sCluster(cfg.cluster_name, Mk8sClusterArgs(
        parent_id=cfg.nebius.parent_id, name=cfg.cluster_name, subnet_id=network.subnet_id,
        k8s_version=cfg.nebius.k8s_version, public_endpoint=cfg.nebius.public_endpoint,
        node_groups=list(plan.node_groups), filesystem_ids=dict(filesystems.ids),
    ))


def build_buckets(cfg: StackConfig) -> Buckets | None:
    if cfg.buckets is None or cfg.nebius is None:
        return None
    return Buckets(f"{cfg.cluster_name}-buckets", BucketsArgs(
        parent_id=cfg.nebius.parent_id, name=cfg.cluster_name, config=cfg.buckets,
    ))


def cluster_kubeconfig(cfg: StackConfig, cluster: Mk8sCluster) -> pulumi.Output[str]:
    return pulumi.Output.secret(pulumi.Output.all(cluster.endpoint, cluster.ca_certificate).apply(
        lambda parts: kubeconfig(cfg.cluster_name, parts[0], parts[1])
    ))


def build_backup_access(cfg: StackConfig, buckets: Buckets | None) -> BackupAccess | None:
    """The service account and key k8up writes jail backups with (when the backups bucket exists)."""
    if buckets is None or "backups" not in buckets.names:
        return None
    assert cfg.nebius is not None and cfg.nebius.tenant_id is not None
    return BackupAccess(f"{cfg.cluster_name}-backups", BackupAccessArgs(
        parent_id=cfg.nebius.parent_id, tenant_id=cfg.nebius.tenant_id, name=cfg.cluster_name,
    ))


def build_soperator(
    cfg: StackConfig, plan: Layout, network: Network, filesystems: SharedFilesystems, cluster: Mk8sCluster,
    buckets: Buckets | None, backup_access: BackupAccess | None, config: pulumi.Output[str],
) -> Soperator:
    assert cfg.nebius is not None
    backup = None
    if buckets is not None and backup_access is not None:
        backup = BackupTarget(bucket=buckets.names["backups"], endpoint=nebius_s3_endpoint(cfg.nebius.region))
    releases = release_plan(cfg, list(plan.node_groups), network.login_allocation_id, dict(filesystems.size_gib),
                            backup)
    return Soperator(f"{cfg.cluster_name}-soperator", SoperatorArgs(
        kubeconfig=config, releases=releases,
        depends_on=[*cluster.node_groups.values(), *cluster.applications.values()],
        backup_credentials=backup_access.credentials if backup_access is not None else None,
        chart_mirror=cfg.soperator.chart_mirror if cfg.soperator is not None else None,
    ))


def build_platform(cfg: StackConfig, plan: Layout) -> Platform | None:
    """Every cloud component of a nebius stack; None for the local stack."""
    if cfg.target != "nebius":
        return None
    network = build_network(cfg)
    filesystems = build_filesystems(cfg, plan)
    cluster = build_cluster(cfg, plan, network, filesystems)
    buckets = build_buckets(cfg)
    backup_access = build_backup_access(cfg, buckets)
    config = cluster_kubeconfig(cfg, cluster)
    soperator = build_soperator(cfg, plan, network, filesystems, cluster, buckets, backup_access, config)
    return Platform(network, filesystems, cluster, buckets, backup_access, soperator, config)


def platform_section(cfg: StackConfig, plan: Layout, platform: Platform) -> PlatformOutputs:
    """Cluster, node groups, filesystems, buckets, login and Slurm facts of a nebius stack (ids still Outputs)."""
    assert cfg.nebius is not None and cfg.soperator is not None
    specs = plan.node_groups
    workers = [s for s in specs if s.role == "worker"]
    return PlatformOutputs.model_construct(
        region=cfg.nebius.region,
        k8s_version=cfg.nebius.k8s_version,
        cluster_id=platform.cluster.cluster_id,
        cluster_endpoint=platform.cluster.endpoint,
        subnet_id=platform.network.subnet_id,
        login_address=platform.network.login_address,
        login_port=22,
        login_allocation_id=platform.network.login_allocation_id,
        soperator_version=cfg.soperator.version,
        slurm_version=cfg.soperator.slurm_version,
        slurm_namespace=cfg.slurm_namespace,
        kubeconfig=platform.kubeconfig,
        worker_nodes=sum(s.size for s in workers),
        gpus_total=sum(s.size * s.gpus for s in workers),
        node_groups={flat_name(spec.name): NodeGroup.model_construct(
            id=platform.cluster.node_group_ids[spec.name], platform=spec.platform, preset=spec.preset,
            nodes=spec.fixed_size if spec.fixed_size is not None else spec.min_size,
            max_nodes=spec.fixed_size if spec.fixed_size is not None else spec.max_size,
            gpus_per_node=spec.gpus, boot_disk_gib=spec.boot_disk.size_gib) for spec in specs},
        filesystems={flat_name(fs.mount_tag): Filesystem.model_construct(
            id=platform.filesystems.ids[fs.mount_tag], size_gib=platform.filesystems.size_gib[fs.mount_tag])
            for fs in plan.filesystems},
        buckets=dict(platform.buckets.names) if platform.buckets is not None else {},
    )


def pipeline_transport(cfg: StackConfig, platform: Platform | None) -> pulumi.Input[dict] | None:
    """This machine for the local stack; SSH to the login node with the pipeline key on cloud stacks
    (None when no key is configured: the platform is built, the pipeline is not)."""
    if cfg.target == "local":
        return {"kind": "local"}
    key = pulumi.Config(PROJECT).get_secret(PIPELINE_KEY_CONFIG)
    if key is None:
        return None
    if cfg.cluster is not None:
        cluster = cfg.cluster
        return pulumi.Output.secret({
            "kind": "ssh", "host": cluster.login_host, "user": cluster.user, "port": cluster.login_port,
            "private_key": key, "host_key": cluster.pinned_host_key(REPO_ROOT),
        })
    assert platform is not None
    return pulumi.Output.secret({
        "kind": "ssh", "host": platform.network.login_address, "user": cfg.pipeline.ssh_user,
        "port": cfg.pipeline.ssh_port, "private_key": key, "host_key": cfg.pipeline.login_host_key,
        **({"require_pinned": True} if cfg.pipeline.require_pinned_host_key else {}),
    })


def build_pipeline(cfg: StackConfig, platform: Platform | None) -> Pipeline | None:
    """The job chain of the stack's run config, shipped and submitted once the Slurm cluster is up."""
    transport = pipeline_transport(cfg, platform)
    if transport is None:
        return None
    run = load_run_config(REPO_ROOT / cfg.pipeline.run_config)
    location = code_location_for(cfg, run, REPO_ROOT)
    # the data file's content joins the fingerprints where it can be read at plan time (this machine);
    # on cloud stacks `ftstack run` reads it over SSH
    data = fingerprint_source(LocalTransport(), run, run_root(run, location)) if cfg.target == "local" else None
    jobs = pipeline_jobs(cfg, run, cfg.pipeline.run_config, code_hash(REPO_ROOT), location, serve=cfg.pipeline.serve,
                         data_sha256=data.sha256 if data else None, plan=measured_plan(cfg, price_inputs(cfg, REPO_ROOT), run))
    after = list(platform.soperator.releases.values()) if platform is not None else []
    return Pipeline(f"{cfg.cluster_name}-pipeline", PipelineArgs(
        source_dir=str(REPO_ROOT), code_root=location.code_root, transport=transport, jobs=jobs,
        slurm_env=location.slurm_env, wait=cfg.pipeline.wait, depends_on=after,
        environment=location.environment, repo_root=str(REPO_ROOT),
    ))


def stack_cost(cfg: StackConfig, pipeline: Pipeline | None) -> Cost:
    """The cost section, priced with the stack's newest stored measurement; with a pipeline, its chats are priced
    again with the eval job's generation speed once it reports (the same `price_stack`, inside the Output)."""
    inputs, run = price_inputs(cfg, REPO_ROOT), load_run(cfg)
    cost = price_stack(cfg, inputs, run).section()
    if pipeline is None or not cost.chats:
        return cost
    chats = pipeline.evaluation.apply(lambda e: price_stack(cfg, inputs.with_evaluation(e), run).section().chats)
    return cost.model_copy(update={"chats": {
        name: ChatCost.model_construct(**{field: chats.apply(lambda c, n=name, f=field: getattr(c[n], f))
                                          for field in ChatCost.model_fields})
        for name in cost.chats}})


def build_stack(cfg: StackConfig) -> StackOutputs:
    """Build every resource of the stack and return its outputs (flattened only when exported)."""
    plan = layout(cfg)
    platform = build_platform(cfg, plan)
    pipeline = build_pipeline(cfg, platform)
    return StackOutputs.model_construct(
        **stack_identity(cfg), cost=stack_cost(cfg, pipeline),
        platform=platform_section(cfg, plan, platform) if platform is not None else None,
        monitoring=monitoring_access(cfg),
        pipeline=pipeline.section() if pipeline is not None else None,
        environment=environment_section(env) if pipeline is not None and (env := environment_plan(cfg)) else None,
    )
