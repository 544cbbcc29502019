"""The orders example: a billing app charging orders, used by the docs and `make demo`."""
