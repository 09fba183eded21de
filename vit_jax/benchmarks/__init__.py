"""Measuring speed and checking hardware: timed blocks, input and device reports, cross-lowering."""
