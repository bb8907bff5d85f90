"""Cache analyses of a trace: reuse intervals, LRU stack distances, policy simulations, plots."""
