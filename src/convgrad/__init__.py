"""convgrad: convolution gradients with the exact semantics of oneDNN Graph, OpenVINO and
TensorFlow, on NumPy, on any CPU.

Canonical layer (channels-first data, grouped weights, explicit pads)::

    convgrad.conv_forward(src, weights, strides=1, pads_begin=0, pads_end=0, dilations=1, groups=1)
    convgrad.conv_backward_weights(src, diff_dst, kernel, ...)
    convgrad.conv_backward_data(diff_dst, weights, src_spatial, ...)

Front-ends with each framework's own names: ``convgrad.onednn``, ``convgrad.openvino``,
``convgrad.tensorflow.raw_ops``.
"""

from .dispatch import (ALGORITHMS, DEFAULT_WORKSPACE_LIMIT, choose_algorithm, get_workspace_limit,
                       set_workspace_limit, workspace_limit)
from .errors import ConvError, ConvTypeError, ConvValueError, WorkspaceError
from .kernels.results import (DEFAULT_RESULT_CACHE_LIMIT, get_result_cache_limit, release_result_cache,
                              result_cache_limit, set_result_cache_limit)
from .ops import conv_backward_data, conv_backward_weights, conv_forward
from .spec import ConvSpec, forward_size, make_spec, transposed_size
from .threads import get_num_threads, set_num_threads

__version__ = "0.1.0"

# Front-ends and optional layers load on first use: ``convgrad.onednn.Convolution`` works
# after a plain ``import convgrad`` without paying for every module at import time.
_SUBMODULES = ("onednn", "openvino", "tensorflow", "dask", "translate", "bench", "cli")


def __getattr__(name: str):
    if name in _SUBMODULES:
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'convgrad' has no attribute {name!r}")

__all__ = [
    "ALGORITHMS", "DEFAULT_RESULT_CACHE_LIMIT", "DEFAULT_WORKSPACE_LIMIT", "ConvError", "ConvSpec", "ConvTypeError", "ConvValueError",
    "WorkspaceError", "choose_algorithm", "conv_backward_data", "conv_backward_weights", "conv_forward",
    "forward_size", "get_num_threads", "get_result_cache_limit", "get_workspace_limit", "set_num_threads", "make_spec", "release_result_cache",
    "result_cache_limit", "set_result_cache_limit", "set_workspace_limit", "transposed_size", "workspace_limit",
    "__version__",
]
