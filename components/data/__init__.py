"""Data: caption sources, the training shard stream, ShapesWorld (world, grammar, exact rules)."""
