"""Study tools beside the pipeline: the learning curves a training run tracks (tracking.py) and the binding probe
(binding_probe.py). A library: stages call it, it never imports a stage."""
