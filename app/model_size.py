"""The bundled trainer's gradient size, without torch: what `launcher doctor --links` predicts an allreduce for.

SimpleNet (app/model.py): conv1 1x10x5x5 + 10, conv2 10x20x5x5 + 20, fc1 320x10 + 10. tests/test_links.py checks
the count against the real model, so a change to the model that forgets this number fails there.
"""

SIMPLENET_PARAMETERS = 8_490
SIMPLENET_GRADIENT_MB = SIMPLENET_PARAMETERS * 4 / 1e6
"""float32 gradients, in MB of 1e6 bytes (as app.bench ps-vs-ring's --megabytes)."""
