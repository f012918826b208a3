"""Tools beside the product: trace replay against baselines (`replay`) and benches (`bench`).

They import the product; the product never imports them (only the CLI dispatches to them).
"""
