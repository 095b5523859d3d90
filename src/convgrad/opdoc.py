"""Op documentation records (pure data): every front-end op describes itself with one
``OpDoc`` so that docs/ops.md can be generated from the code (``python -m convgrad.opdoc``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Attr:
    name: str
    type: str            # e.g. "s64[]", "string", "int", "bool"
    default: str         # "required" for required attributes
    allowed: str         # human-readable allowed values


@dataclass(frozen=True)
class OpDoc:
    framework: str               # "oneDNN Graph", "OpenVINO", "TensorFlow"
    name: str                    # the framework's op name, verbatim
    python: str                  # how to call it, e.g. "convgrad.onednn.Convolution(...)(src, weights, bias=None)"
    inputs: tuple[str, ...]      # framework input names in order
    attributes: tuple[Attr, ...]
    layouts: str                 # data / weights layouts
    dtypes: str                  # element types
    checked_against: str         # which real framework(s) the tests compare with
    notes: str = ""


REGISTRY: list[OpDoc] = []


def register(doc: OpDoc) -> OpDoc:
    REGISTRY.append(doc)
    return doc


def render_markdown() -> str:
    """The op table of docs/ops.md, from every registered OpDoc (front-ends imported first)."""
    import importlib

    for mod in ("convgrad.onednn", "convgrad.openvino", "convgrad.tensorflow.raw_ops"):
        try:
            importlib.import_module(mod)
        except ImportError:  # pragma: no cover - a front-end not written yet
            pass
    lines = ["# convgrad operators", "", "Generated from the code by `python -m convgrad.opdoc`; do not edit by hand.", ""]
    for fw in ("oneDNN Graph", "OpenVINO", "TensorFlow"):
        docs = [d for d in REGISTRY if d.framework == fw]
        if not docs:
            continue
        lines += [f"## {fw}", "", "| op | call | inputs | layouts | dtypes | checked against |", "|---|---|---|---|---|---|"]
        for d in docs:
            lines.append(f"| `{d.name}` | `{d.python}` | {', '.join(d.inputs)} | {d.layouts} | {d.dtypes} | {d.checked_against} |")
        lines.append("")
        for d in docs:
            lines += [f"### {fw} `{d.name}`", ""]
            if d.notes:
                lines += [d.notes, ""]
            lines += ["| attribute | type | default | allowed |", "|---|---|---|---|"]
            lines += [f"| `{a.name}` | {a.type} | {a.default} | {a.allowed} |" for a in d.attributes]
            lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    # Run as a script this module is __main__, not convgrad.opdoc, whose REGISTRY the
    # front-ends fill: render from the imported module.
    from convgrad.opdoc import render_markdown as _render

    print(_render())
