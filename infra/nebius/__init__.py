"""Pulumi components over pulumi-nebius resources."""
