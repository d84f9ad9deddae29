"""Meshes, sharding rules and the multi-controller runtime: used by training, the audit and
the memory plan alike, so they sit below all three."""
