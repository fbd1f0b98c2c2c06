"""Stage 6, whole training steps: ``compile_step`` (one program) and ``largest_batch`` (what fits
on a TPU you don't have). Imports the stages below.
"""
