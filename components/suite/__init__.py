"""The benchmark suite: readers of the official formats and the metrics."""
