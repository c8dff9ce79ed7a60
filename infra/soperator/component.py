"""Soperator: a Kubernetes provider for the mk8s cluster, then the Helm releases of a Slurm cluster."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra.monitoring import releases as mon
from infra.nebius import backups
from infra.nebius.backups import BackupCredentials, RepositoryPassword
from infra.soperator import helm_render, helm_values
from infra.soperator.values import BACKUP_SECRET, STORAGE_CLASS, ReleaseSpec

BACKUP_RELEASE = "soperator-backup-config"
K8UP_RELEASE = "k8up"


@dataclass
class SoperatorArgs:
    kubeconfig: pulumi.Input[str]
    """Kubeconfig of the target cluster (a secret)."""
    releases: list[ReleaseSpec]
    """Releases in install order (see ``soperator_values.release_plan``)."""
    depends_on: list[pulumi.Resource]
    """Resources that must exist before anything is installed (the node groups, GPU/network operators)."""
    backup_credentials: BackupCredentials | None = None
    """Keys k8up writes the jail backups with; required when the releases include the backup schedule."""
    chart_mirror: str | None = None
    """Folder of ``<name>-<version>.tgz`` chart packages to install from (the stack's ``soperator.chartMirror``);
    unset: ``FT_CHART_MIRROR``, else each release's repository."""


class Soperator(pulumi.ComponentResource):
    """Storage class and Helm releases, each release waiting for the ones its spec names."""

    releases: dict[str, k8s.helm.v3.Release]
    statuses: dict[str, pulumi.Output[str]]
    grafana_admin_password: pulumi.Output[str] | None
    """Grafana's admin password (a secret), where the monitoring releases are installed."""

    def __init__(self, name: str, args: SoperatorArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:k8s:Soperator", name, None, opts)
        provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=args.kubeconfig, opts=pulumi.ResourceOptions(parent=self)
        )
        storage_class = k8s.storage.v1.StorageClass(
            f"{name}-{STORAGE_CLASS}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=STORAGE_CLASS),
            provisioner="compute.csi.nebius.com",
            volume_binding_mode="WaitForFirstConsumer",
            parameters={"type": "NETWORK_SSD", "csi.storage.k8s.io/fstype": "ext4"},
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=args.depends_on),
        )
        self.releases = {}
        self.grafana_admin_password = None
        self._mirror = helm_render.chart_mirror(args.chart_mirror)
        for spec in args.releases:
            after: list[pulumi.Resource] = [self.releases[key] for key in spec.depends_on] or [storage_class]
            if spec.key == BACKUP_RELEASE:
                if args.backup_credentials is None:
                    raise ValueError(f"release {BACKUP_RELEASE}: no backup credentials given")
                after.append(self._backup_secret(name, spec.namespace, args.backup_credentials, provider, after))
            if spec.key == K8UP_RELEASE:
                after.append(self._k8up_crds(name, spec.version, provider, after))
            if spec.key == mon.METRICS:
                after.append(self._grafana_secret(name, spec.namespace, provider, after))
            self.releases[spec.key] = self._release(name, spec, provider, after)
        self.statuses = {key: r.status.apply(lambda s: s.status) for key, r in self.releases.items()}
        self.register_outputs({"statuses": self.statuses})

    def _backup_secret(self, name: str, namespace: str, creds: BackupCredentials, provider: k8s.Provider,
                       after: list[pulumi.Resource]) -> k8s.core.v1.Secret:
        """The Secret helm-soperator-backup-config's Schedule reads (its default key names)."""
        return k8s.core.v1.Secret(
            f"{name}-{BACKUP_SECRET}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=BACKUP_SECRET, namespace=namespace),
            type="Opaque",
            string_data={
                "aws-access-key-id": creds.access_key_id,
                "aws-access-secret-key": creds.secret_access_key,
                "backup-password": creds.repository_password,
            },
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after),
        )

    def _k8up_crds(self, name: str, version: str, provider: k8s.Provider,
                   after: list[pulumi.Resource]) -> k8s.yaml.v2.ConfigFile:
        """k8up's CRDs from its release asset, after its sha256 is checked (server-side applied: pulumi-kubernetes'
        default, as the chart's README applies them; the podconfigs CRD is too large for client-side apply)."""
        url = backups.k8up_crds_url(version)
        digest = backups.VerifiedDownload(f"{name}-k8up-crds-digest", url, backups.k8up_crds_sha256(version),
                                          opts=pulumi.ResourceOptions(parent=self))
        return k8s.yaml.v2.ConfigFile(f"{name}-k8up-crds", file=url, opts=pulumi.ResourceOptions(
            parent=self, provider=provider, depends_on=[*after, digest]))

    def _grafana_secret(self, name: str, namespace: str, provider: k8s.Provider,
                        after: list[pulumi.Resource]) -> k8s.core.v1.Secret:
        """The Secret the grafana subchart reads its admin login from (``admin.existingSecret``); a generated password."""
        password = RepositoryPassword(f"{name}-grafana-admin-password", opts=pulumi.ResourceOptions(parent=self))
        self.grafana_admin_password = pulumi.Output.secret(password.password)
        return k8s.core.v1.Secret(
            f"{name}-{mon.GRAFANA_ADMIN_SECRET}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=mon.GRAFANA_ADMIN_SECRET, namespace=namespace),
            type="Opaque",
            string_data={mon.GRAFANA_USER_KEY: mon.GRAFANA_ADMIN_USER, mon.GRAFANA_PASSWORD_KEY: self.grafana_admin_password},
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after),
        )

    def _release(
        self, name: str, spec: ReleaseSpec, provider: k8s.Provider, after: list[pulumi.Resource]
    ) -> k8s.helm.v3.Release:
        chart, repo = spec.chart, spec.repo
        if self._mirror is not None:
            chart = str(helm_render.mirrored_package(helm_render.package_name(spec.chart), spec.version, self._mirror))
            repo = None
        return k8s.helm.v3.Release(
            f"{name}-{spec.key}",
            k8s.helm.v3.ReleaseArgs(
                name=spec.name,
                chart=chart,
                version=spec.version,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo) if repo else None,
                namespace=spec.namespace,
                create_namespace=True,
                values=spec.values,
                value_yaml_files=[pulumi.StringAsset(helm_values.deletion_yaml(spec.deletions))] if spec.deletions else None,
                skip_crds=spec.skip_crds,
                wait_for_jobs=True,
                timeout=spec.timeout_s,
            ),
            opts=pulumi.ResourceOptions(parent=self, provider=provider, depends_on=after),
        )
