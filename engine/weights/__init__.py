"""Loading a model: where it comes from (directory, GGUF, synthetic), checkpoints, the device,
and its fingerprint (what decides the K/V it computes)."""
