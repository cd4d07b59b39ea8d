"""The runner application: config schema, preflight checks, mesh, data, model, train step and loop,
tracking, checkpoints. Entry point: ``python -m runner``."""
