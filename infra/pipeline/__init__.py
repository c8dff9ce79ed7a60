"""Pipeline plumbing: transports (local, SSH), the Slurm client, and the dynamic resources built on them."""
