"""Per-paper pieces that are not algorithms: PerFed-CKT's toy example, SCD's new clients."""
