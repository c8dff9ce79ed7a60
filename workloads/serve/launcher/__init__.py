"""The launcher (`python -m workloads.serve.launcher.launch`, the serve job): plans the engine processes
(engine_plan.py: engine choice, argv, routes; no HTTP), checks the vLLM install (vllm_install.py), starts and
supervises the engines (supervise.py) and runs the gateway in its own process."""
