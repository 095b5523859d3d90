"""Regenerate the OpenVINO IR v11 examples (ov_group_deconv_{1d,2d,3d}.xml + .bin).

They are the three GroupConvolutionBackpropData layers of OpenVINO's op specification
(GroupConvolutionBackpropData-1, "Example" section), with the layer's attributes and port
shapes exactly as the specification writes them, wrapped into a runnable model:

    Parameter "data" [1, 20, 224...] -> GroupConvolutionBackpropData <- Const "filters" [4, 5, 2, 3...]
                                        -> Result

The filters are a Const whose values live in the .bin next to the .xml (float32, seeded, so
the files are reproducible): ``python examples/make_ov_examples.py`` rewrites them.
"""

from __future__ import annotations

import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def _port(pid: int, dims, indent: str, names: str | None = None) -> str:
    nm = f' names="{names}"' if names else ""
    body = "".join(f"{indent}\t<dim>{d}</dim>\n" for d in dims)
    return f'{indent}<port id="{pid}" precision="FP32"{nm}>\n{body}{indent}</port>\n'


def ir(name: str, nsp: int) -> tuple[str, bytes]:
    data = (1, 20) + (224,) * nsp
    filters = (4, 5, 2) + (3,) * nsp
    out = (1, 8) + (447,) * nsp
    ones = ",".join(["1"] * nsp)
    twos = ",".join(["2"] * nsp)
    w = np.random.default_rng(nsp).standard_normal(filters, dtype=np.float32)
    raw = w.tobytes()
    t = "\t\t\t"
    xml = f"""<?xml version="1.0"?>
<net name="{name}" version="11">
\t<layers>
\t\t<layer id="0" name="data" type="Parameter" version="opset1">
\t\t\t<data shape="{','.join(map(str, data))}" element_type="f32"/>
\t\t\t<output>
{_port(0, data, t + chr(9), 'data')}\t\t\t</output>
\t\t</layer>
\t\t<layer id="1" name="filters" type="Const" version="opset1">
\t\t\t<data element_type="f32" shape="{','.join(map(str, filters))}" offset="0" size="{len(raw)}"/>
\t\t\t<output>
{_port(0, filters, t + chr(9))}\t\t\t</output>
\t\t</layer>
\t\t<layer id="5" name="upsampling_node" type="GroupConvolutionBackpropData" version="opset1">
\t\t\t<data dilations="{ones}" pads_begin="{ones}" pads_end="{ones}" strides="{twos}"/>
\t\t\t<input>
{_port(0, data, t + chr(9))}{_port(1, filters, t + chr(9))}\t\t\t</input>
\t\t\t<output>
{_port(2, out, t + chr(9), 'output')}\t\t\t</output>
\t\t</layer>
\t\t<layer id="6" name="output" type="Result" version="opset1">
\t\t\t<input>
{_port(0, out, t + chr(9))}\t\t\t</input>
\t\t</layer>
\t</layers>
\t<edges>
\t\t<edge from-layer="0" from-port="0" to-layer="5" to-port="0"/>
\t\t<edge from-layer="1" from-port="0" to-layer="5" to-port="1"/>
\t\t<edge from-layer="5" from-port="2" to-layer="6" to-port="0"/>
\t</edges>
\t<rt_info/>
</net>
"""
    return xml, raw


if __name__ == "__main__":
    for nsp in (1, 2, 3):
        stem = os.path.join(HERE, f"ov_group_deconv_{nsp}d")
        xml, raw = ir(f"group_deconv_{nsp}d", nsp)
        with open(stem + ".xml", "w") as f:
            f.write(xml)
        with open(stem + ".bin", "wb") as f:
            f.write(raw)
        print(stem + ".xml")
