"""How big and how fast a run is on a stack: the throughput estimate, where the run fits, the tokens and passes it
makes, its duration and the time model of networks, node counts and offload. Below `infra.cost` (which prices what
sizing decides) and `infra.pipeline` (which schedules it); imports only config, catalog, documents and
workloads.train."""
