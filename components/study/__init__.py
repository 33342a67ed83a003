"""Study tools beside the pipeline: the learning curves a training run tracks (tracking.py), the binding probe
(binding_probe.py) and the probes of NegCLIP's training signal (negatives_probe.py, neighbour_probe.py). A library:
stages call it, it never imports a stage."""
