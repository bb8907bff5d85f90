"""Beam building blocks: pure functions, with thin DoFns and composite PTransforms around them."""
