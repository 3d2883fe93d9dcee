"""A run's description and its building: `RunConfig` (validated against every registry) and the
federation it builds (partition, client tensors, public set, models)."""
