"""Fine-tuning: QLoRA/LoRA with DDP, checkpoints and resume, run records, adapter export."""
