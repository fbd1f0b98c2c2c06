"""Stage 0, the shared vocabulary every stage uses: errors, dtypes, symbolic sizes, the user's
source line, devices, the torch <-> JAX crossing and its byte counter, recompile hints. Imports
nothing of tpu_inductor's outside this folder.
"""

# The package's version (``tpu_inductor.__version__``); warm-start exports are keyed by it.
VERSION = "0.1.0"
