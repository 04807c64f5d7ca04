"""MIG facts and arithmetic in pure Python (no Django), shared by the apps and the simulator."""
