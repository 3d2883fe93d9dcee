"""The engine: seeds, local training, aggregation, the context algorithms use, the round loop, its
schedules and simulated clock, and the batched engine. Imports data/ and params only."""
