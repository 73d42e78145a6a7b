"""Benchmarks: time and memory scaling, each point measured in a fresh process."""
