"""Idempotent side effects enforced by a database unique constraint."""
