"""Benchmarks: every comparison runs its contenders interleaved in one run and reports median ratios.

`python -m bench` (or `scripts/bench`) prints a table and writes bench/results/<name>.json.
"""
