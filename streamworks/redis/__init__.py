"""Everything that knows Redis key names, scripts and connections."""
