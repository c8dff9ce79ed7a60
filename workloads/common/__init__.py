"""Helpers shared by the workload stages."""
