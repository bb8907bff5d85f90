"""The replacement policies `simulate` replays (policies.py), named apart from their numba code
so that building the command line does not compile it (~0.4 s on every command)."""

POLICIES = ("lru", "prefix-lru", "fifo", "belady")
# The policies calibrate fits: serving engines' kinds (belady is the offline optimum).
CALIBRATED_POLICIES = ("lru", "prefix-lru", "fifo")
