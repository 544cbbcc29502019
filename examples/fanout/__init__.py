"""Fan-out: two consumer groups on one stream, each handling every event."""
