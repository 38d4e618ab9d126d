"""Data-parallel training recipes for PyTorch: one script per technique."""
