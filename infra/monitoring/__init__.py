"""Job metrics in Prometheus: where a stack's Prometheus is, its HTTP API, a job's series and live figures."""
