"""Stage 4, compiling for a TPU target without a TPU: targets and their chips, the compile-only
call, the programs it records, the HLO read from each, and ``tpu_inductor.tpu_report()``.
Imports the stages below.
"""
