"""Small side-effect helpers for scripts: metrics JSONL and plots."""
