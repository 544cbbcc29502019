"""The data plane: reading owned shards, running handlers, acking, retrying, DLQ, producing."""
