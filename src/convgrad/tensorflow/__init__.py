"""TensorFlow front-end: ``convgrad.tensorflow.raw_ops`` has TensorFlow's raw convolution ops
(Conv2D, Conv3D, their backprop ops and the depthwise ops) with TensorFlow's names, arguments
and defaults, computed by the canonical core on NumPy arrays.
"""

from . import raw_ops

__all__ = ["raw_ops"]
