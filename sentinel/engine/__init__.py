"""The engine: the only place with a training loop (`sim` backend in sim.py)."""
