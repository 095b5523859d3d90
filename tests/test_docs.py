"""Docs generated from the code stay current; the public names of API.md exist."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

OPS = {
    "convgrad.onednn": ["Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights", "ConvTranspose",
                        "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"],
    "convgrad.openvino": ["Convolution", "GroupConvolution", "ConvolutionBackpropData",
                          "GroupConvolutionBackpropData"],
    "convgrad.tensorflow.raw_ops": [
        "Conv2D", "Conv3D", "Conv2DBackpropFilter", "Conv2DBackpropFilterV2", "Conv2DBackpropInput",
        "Conv2DBackpropInputV2", "Conv3DBackpropFilter", "Conv3DBackpropFilterV2", "Conv3DBackpropInput",
        "Conv3DBackpropInputV2", "DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropFilter",
        "DepthwiseConv2dNativeBackpropInput"],
}


def test_ops_table_is_generated_from_the_code():
    """docs/ops.md == `python -m convgrad.opdoc` (regenerate it when an op changes)."""
    out = subprocess.run([sys.executable, "-m", "convgrad.opdoc"], capture_output=True, text=True, check=True).stdout
    assert (ROOT / "docs" / "ops.md").read_text() == out


def test_every_op_is_documented_with_its_oracle():
    from convgrad.opdoc import REGISTRY, render_markdown

    render_markdown()
    names = {(d.framework, d.name): d for d in REGISTRY}
    fw = {"convgrad.onednn": "oneDNN Graph", "convgrad.openvino": "OpenVINO", "convgrad.tensorflow.raw_ops": "TensorFlow"}
    for mod, ops in OPS.items():
        for op in ops:
            doc = names[(fw[mod], op)]
            assert doc.checked_against and doc.attributes


def test_front_ends_load_after_a_plain_import():
    """API.md: `import convgrad` then `convgrad.onednn.X`, `convgrad.openvino.X`, ...; fresh process."""
    code = "import convgrad\n" + "\n".join(
        f"assert callable({mod}.{op}), '{mod}.{op}'" for mod, ops in OPS.items() for op in ops)
    subprocess.run([sys.executable, "-c", code], check=True)
