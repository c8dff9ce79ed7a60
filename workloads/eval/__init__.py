"""Evaluation: base against fine-tuned model on the test split (perplexity, speed, length, text scores)."""
