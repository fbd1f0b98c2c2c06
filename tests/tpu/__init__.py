"""tests/tpu/: the ``tpu`` stage (targets, TPU programs, HLO readers), and compiling for TPU
topologies without a TPU (libtpu's compiler, nothing runs).

The libtpu tests are marked ``tpu_compile`` in their files; tests/conftest.py leaves them out of a
plain ``pytest`` and skips them where libtpu is not installed. CI runs them in a step of their own:
``pip install -e '.[tpu]' && JAX_PLATFORMS=cpu python -m pytest -q -m tpu_compile``.
"""
