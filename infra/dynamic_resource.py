"""Pulumi dynamic resources that leave Python's pickler as they found it.

pulumi's `serialize_provider` (pulumi/dynamic/dynamic.py) replaces `pickle._Pickler._batch_setitems`
and `save_dict` with sorting wrappers on every dynamic resource it builds and never puts them back:
each resource wraps the previous wrapper. In a long-lived process (the Automation API, a test suite,
`ftstack` running several programs) the chain grows until any dill user that inherits from
`pickle._Pickler` (datasets' fingerprinting among them) dies with RecursionError.
"""

from __future__ import annotations

import pickle
from typing import Any

import pulumi
from pulumi.dynamic import Resource, ResourceProvider

_PATCHED_BY_PULUMI = ("_batch_setitems", "save_dict")


class DynamicResource(Resource):
    """`pulumi.dynamic.Resource` whose provider serialisation restores the pickler methods it patched."""

    def __init__(self, provider: ResourceProvider, name: str, props: dict[str, Any],
                 opts: pulumi.ResourceOptions | None = None) -> None:
        saved = {attr: pickle._Pickler.__dict__[attr] for attr in _PATCHED_BY_PULUMI}
        try:
            super().__init__(provider, name, props, opts)
        finally:
            for attr, method in saved.items():
                setattr(pickle._Pickler, attr, method)
