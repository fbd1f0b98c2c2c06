"""Stage 3, the call: executables per signature (``call``), their cache, what stays on the device
(``residency``, ``sharding``), shape buckets, device-owned state and eager ops on it, warm
starts from disk, and ``tpu_inductor.report()``. Imports the stages below.
"""

# Loaded with the package: it puts the device path of eager ops on DeviceTensors into
# device_owned (see device_owned.RUN_ON_DEVICE).
from tpu_inductor.runtime import device_eager  # noqa: F401
