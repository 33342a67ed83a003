"""Helpers every stage uses: params (the one schema), atomic files, tracking, checkpoints, reports."""
