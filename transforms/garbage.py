"""The cyclic garbage collector, set for encoding.

Parsing and rendering allocate millions of short-lived dicts and lists, and every template
render that raises (DeepSeek-R1's on tool-call arguments as objects) leaves a cycle of
traceback and frames for the collector, whose full passes walk every object start-up built
(transformers' modules, the tokenizer's tables) unless those are frozen.
"""

from __future__ import annotations

import gc


def settle_after_start_up() -> None:
    """Collect once and freeze what is left: start-up's objects are never walked again, nor
    copied into a forked worker's pages by being walked. (Collecting young objects less often
    was measured too: no faster beyond this machine's noise, and 110-180 MB more at peak.)"""
    gc.collect()
    gc.freeze()
