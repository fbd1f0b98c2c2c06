"""Stage 5, the Dynamo entry: ``backend="tpu"`` (``backend``), the options parsed once
(``config``), graph breaks said once per site (``breaks``), compiled optimizer steps
(``optimizers``) and ahead-of-time warmup. Imports the stages below.
"""
