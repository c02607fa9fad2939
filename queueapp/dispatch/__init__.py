"""The GPU dispatcher: claim one job, forward it to llama-swap, finish it, repeat."""
