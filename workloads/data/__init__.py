"""Data stages: sample (or fetch), convert, split, tokenize. Each is `python -m workloads.data.<stage>`."""
