"""BackupAccess: who may write jail backups into the backups bucket, and the restic repository password.

As in nebius-solutions-library (soperator/modules/backups): a service account in the tenant's
``editors`` group and an access key of it. The key and a generated repository password are Pulumi
secrets; ``infra/soperator/component.py`` turns them into the Kubernetes Secret k8up reads.
"""

from __future__ import annotations

import hashlib
import secrets
import urllib.request
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_nebius as nebius
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider

from infra.dynamic_resource import DynamicResource


@dataclass
class BackupAccessArgs:
    parent_id: pulumi.Input[str]
    """Nebius project id (owner of the service account and its key)."""
    tenant_id: str
    """Tenant whose ``editors`` group the service account joins."""
    name: str
    """Prefix of the service account name."""


@dataclass(frozen=True)
class BackupCredentials:
    """Secret outputs k8up needs: S3 access key id and secret, restic repository password."""

    access_key_id: pulumi.Output[str]
    secret_access_key: pulumi.Output[str]
    repository_password: pulumi.Output[str]


class _PasswordProvider(ResourceProvider):
    """A random password made once at create; kept in the (encrypted) state, never changed by diffs."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(id_=props["name"], outs={**props, "password": secrets.token_urlsafe(32)})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        return DiffResult(changes=olds.get("name") != news.get("name"), replaces=["name"] if olds.get("name") != news.get("name") else [])


K8UP_CRDS_SHA256 = {"4.8.3": "391a8ee489f0e6a5601d1fc514ead59c53c33185f909a706022a599173c95805"}
"""sha256 of k8up's CRDs (release asset ``k8up-crd.yaml`` of k8up-io/k8up's release ``k8up-<chart version>``) per k8up
chart version: the chart ships none (its README: "CRDs need to be installed separately"), and its operator reconciles
them (Schedule, Backup, Prune, ... of group k8up.io)."""


def k8up_crds_url(version: str) -> str:
    """The CRDs the k8up chart's README installs for ``version``."""
    return f"https://github.com/k8up-io/k8up/releases/download/k8up-{version}/k8up-crd.yaml"


def k8up_crds_sha256(version: str) -> str:
    if version not in K8UP_CRDS_SHA256:
        raise ValueError(f"soperator.k8upVersion {version}: the sha256 of its k8up-crd.yaml is not pinned; known for "
                         f"{', '.join(K8UP_CRDS_SHA256)} (infra/nebius/backups.py K8UP_CRDS_SHA256)")
    return K8UP_CRDS_SHA256[version]


class _DigestProvider(ResourceProvider):
    """Downloads ``url`` at create and refuses it unless its sha256 is the pinned one; a change of either replaces it."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        with urllib.request.urlopen(props["url"], timeout=120) as response:  # noqa: S310 (an https release asset)
            digest = hashlib.sha256(response.read()).hexdigest()
        if digest != props["sha256"]:
            raise ValueError(f"{props['url']}: sha256 {digest}, pinned {props['sha256']}")
        return CreateResult(id_=digest, outs=props)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in ("url", "sha256") if olds.get(key) != news.get(key)]
        return DiffResult(changes=bool(changed), replaces=changed)


class VerifiedDownload(DynamicResource):
    """A file on the web whose sha256 is checked before anything that reads it from the same URL is created."""

    def __init__(self, name: str, url: str, sha256: str, opts: pulumi.ResourceOptions | None = None):
        super().__init__(_DigestProvider(), name, {"url": url, "sha256": sha256}, opts)


class RepositoryPassword(DynamicResource):
    password: pulumi.Output[str]

    def __init__(self, name: str, opts: pulumi.ResourceOptions | None = None):
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["password"]))
        super().__init__(_PasswordProvider(), name, {"name": name, "password": None}, opts)


class BackupAccess(pulumi.ComponentResource):
    credentials: BackupCredentials

    def __init__(self, name: str, args: BackupAccessArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("soperator-finetune:nebius:BackupAccess", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        account = nebius.IamV1ServiceAccount(f"{name}-sa", parent_id=args.parent_id, name=f"{args.name}-backup-sa",
                                             opts=child)
        editors = nebius.get_iam_v1_group_output(name="editors", parent_id=args.tenant_id,
                                                 opts=pulumi.InvokeOutputOptions(parent=self))
        membership = nebius.IamV1GroupMembership(f"{name}-editor", parent_id=editors.id, member_id=account.id,
                                                 opts=child)
        key = nebius.IamV2AccessKey(
            f"{name}-key", parent_id=args.parent_id, name=f"{args.name}-backup-key",
            account=nebius.IamV2AccessKeyAccountArgs(
                service_account=nebius.IamV2AccessKeyAccountServiceAccountArgs(id=account.id)),
            secret_delivery_mode="INLINE",
            opts=pulumi.ResourceOptions(parent=self, depends_on=[membership], additional_secret_outputs=["status"]),
        )
        password = RepositoryPassword(f"{name}-password", opts=child)
        self.credentials = BackupCredentials(
            access_key_id=pulumi.Output.secret(key.status.apply(lambda s: (s.aws_access_key_id if s else None) or "")),
            secret_access_key=pulumi.Output.secret(key.status.apply(lambda s: (s.secret if s else None) or "")),
            repository_password=pulumi.Output.secret(password.password),
        )
        self.register_outputs({})
