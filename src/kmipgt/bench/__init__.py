"""Benchmarks: time, memory and approximation experiments."""
