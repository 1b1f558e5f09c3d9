"""Figures inside the page: SVG inlined as markup (crisp at any zoom, text selectable), PNG as a
`data:` URI, each with its caption and alt text (stored in the file by
`normlab.sweep.plotting.save_figure`, or given by the caller).

An SVG is input like any other: it is parsed as XML and written back with only drawing elements
and attributes (no script, no event handler, no foreign object, no style sheet, no reference that
leaves the figure), its ids prefixed so that several figures on one page never share one.

A figure's text is shown whole: where a label runs past the edge of the drawing (an axis label
longer than its panel is tall), the figure's viewBox is widened to take it in (`fit_text`),
instead of the browser cutting the label at the edge.
"""

from __future__ import annotations

import base64
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from normlab.sweep.plotting import figure_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_XLINK = "{http://www.w3.org/1999/xlink}"
# Elements that may run code, pull content in or restyle the page around the figure.
_DROP = {"script", "foreignObject", "style", "iframe", "object", "embed", "audio", "video",
         "metadata", "title", "desc", "animate", "set", "animateTransform", "animateMotion"}
_URL_REF = re.compile(r"url\(\s*#([^)\s]+)\s*\)")


@dataclass
class Figure:
    caption: str
    alt: str
    svg: str = ""        # inline markup (kind svg)
    data_uri: str = ""   # kind png
    problem: str = ""    # kind missing: what is wrong with the file
    name: str = ""       # the file, for the placeholder

    @property
    def kind(self) -> str:
        return "svg" if self.svg else "png" if self.data_uri else "missing"


def is_png(data: bytes) -> bool:
    return data[:8] == PNG_MAGIC


def png_data_uri(data: bytes) -> str:
    if not is_png(data):
        raise ValueError("not a PNG image")
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def inline_svg(data: bytes, prefix: str, alt: str) -> str:
    """The SVG as markup to place in HTML: sanitized (see the module docstring), ids prefixed
    with `prefix`, labelled with `alt` (role="img" and aria-label). Raises ValueError if it is not
    an SVG document."""
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as e:
        raise ValueError(f"not valid XML ({e})") from None
    if _local(root.tag) != "svg":
        raise ValueError(f"the root element is <{_local(root.tag)}>, not <svg>")

    def ref(value: str) -> str:
        return _URL_REF.sub(lambda m: f"url(#{prefix}{m.group(1)})", value)

    def clean(el: ElementTree.Element) -> None:
        for child in list(el):
            if not isinstance(child.tag, str) or _local(child.tag) in _DROP:
                el.remove(child)
            else:
                clean(child)
        el.tag = _local(el.tag)
        attrs = {}
        for name, value in el.attrib.items():
            local = "xlink:href" if name == f"{_XLINK}href" else _local(name)
            if local.lower().startswith("on") or name.startswith("{") and local != "xlink:href":
                continue
            if local in ("href", "xlink:href"):
                if value.startswith("#"):
                    value = f"#{prefix}{value[1:]}"
                elif not value.startswith("data:image/png;base64,"):
                    continue  # a link out of the figure
            elif local == "id":
                value = prefix + value
            elif "url(" in value:
                if re.search(r"url\(\s*[^#\s]", value):
                    continue  # url(...) to anything but an id in the figure
                value = ref(value)
            attrs[local] = value
        el.attrib.clear()
        el.attrib.update(attrs)

    clean(root)
    fit_text(root)
    root.attrib.pop("style", None)  # the figure's box is the page's to lay out
    root.set("role", "img")
    root.set("aria-label", alt)
    root.set("class", "figure")
    return ElementTree.tostring(root, encoding="unicode", short_empty_elements=True)


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_ROTATE = re.compile(rf"^\s*rotate\(\s*({_NUMBER})(?:[\s,]+({_NUMBER})[\s,]+({_NUMBER}))?\s*\)\s*$")
_FONT_SIZE = re.compile(rf"font-size:\s*({_NUMBER})(?:px)?\b|font:[^;]*?({_NUMBER})px")
_ANCHOR = re.compile(r"text-anchor:\s*(start|middle|end)")
_FAMILY = re.compile(r"font-family:\s*'?([^,';]+)")
_WEIGHT = re.compile(r"font-weight:\s*(\w+)")


def _text_box(el: ElementTree.Element) -> tuple[float, float, float, float] | None:
    """(left, top, right, bottom) of a <text> in the figure's coordinates, measured with the
    font metrics matplotlib drew it with; None for text this cannot place (a transform other
    than a rotation, a size not given)."""
    text = "".join(el.itertext()).strip()
    style = el.get("style", "")
    size = _FONT_SIZE.search(style) or _FONT_SIZE.search(f"font-size: {el.get('font-size', '')}")
    transform = el.get("transform", "")
    rotate = _ROTATE.match(transform) if transform else None
    if not text or not size or (transform and not rotate) or \
            any(c.get("x") or c.get("y") or c.get("dy") for c in el.iter() if c is not el):
        return None  # lines placed one by one: not measured as one
    try:
        x, y = float(el.get("x", 0)), float(el.get("y", 0))
        from matplotlib.font_manager import FontProperties
        from matplotlib.textpath import TextToPath

        family = _FAMILY.search(style)
        weight = _WEIGHT.search(style)
        prop = FontProperties(family=family.group(1).strip() if family else "DejaVu Sans",
                              weight=weight.group(1) if weight else "normal",
                              size=float(size.group(1) or size.group(2)))
        w, h, d = TextToPath().get_text_width_height_descent(text, prop, ismath=False)
    except Exception:  # no matplotlib, an odd attribute: leave the figure as it is
        return None
    anchor = _ANCHOR.search(style)
    left = x - w * {"start": 0.0, "middle": 0.5, "end": 1.0}[anchor.group(1) if anchor else
                                                              "start"]
    corners = [(left, y - (h - d)), (left + w, y - (h - d)), (left, y + d), (left + w, y + d)]
    if rotate:
        a = math.radians(float(rotate.group(1)))
        cx = float(rotate.group(2)) if rotate.group(2) else 0.0
        cy = float(rotate.group(3)) if rotate.group(3) else 0.0
        corners = [(cx + (px - cx) * math.cos(a) - (py - cy) * math.sin(a),
                    cy + (px - cx) * math.sin(a) + (py - cy) * math.cos(a))
                   for px, py in corners]
    xs, ys = [c[0] for c in corners], [c[1] for c in corners]
    return min(xs), min(ys), max(xs), max(ys)


def fit_text(root: ElementTree.Element, margin: float = 2.0) -> None:
    """Widen the viewBox of an SVG (and its width and height, in proportion) so that every
    <text> not inside a transformed group lies within it; one that runs past an edge ends up
    `margin` units inside it. A figure whose text all lies within is left as it is."""
    try:
        x0, y0, vw, vh = (float(v) for v in re.split(r"[\s,]+", root.get("viewBox", "").strip()))
    except ValueError:
        return
    left, top, right, bottom = x0, y0, x0 + vw, y0 + vh

    def walk(el: ElementTree.Element) -> None:
        nonlocal left, top, right, bottom
        for child in el:
            if child.tag == "text":
                box = _text_box(child)
                if box:  # only an edge that text crosses moves
                    if box[0] < x0:
                        left = min(left, box[0] - margin)
                    if box[1] < y0:
                        top = min(top, box[1] - margin)
                    if box[2] > x0 + vw:
                        right = max(right, box[2] + margin)
                    if box[3] > y0 + vh:
                        bottom = max(bottom, box[3] + margin)
            elif not child.get("transform"):
                walk(child)

    walk(root)
    if (left, top, right, bottom) == (x0, y0, x0 + vw, y0 + vh):
        return
    nw, nh = right - left, bottom - top
    root.set("viewBox", f"{left:.2f} {top:.2f} {nw:.2f} {nh:.2f}")
    for attr, old, new in (("width", vw, nw), ("height", vh, nh)):
        m = re.fullmatch(rf"\s*({_NUMBER})\s*([a-z%]*)\s*", root.get(attr, ""))
        if m and m.group(2) != "%":
            root.set(attr, f"{float(m.group(1)) * new / old:.2f}{m.group(2)}")


def _decodes(data: bytes) -> bool:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            im.load()
        return True
    except ImportError:  # pillow comes with matplotlib; without it, trust the magic bytes
        return True
    except Exception:
        return False


def figure_from_bytes(data: bytes, prefix: str, *, alt: str = "", caption: str = "",
                      name: str = "") -> Figure:
    """A Figure from SVG or PNG bytes; the caption and alt text stored in the file win over
    the given ones (which stand in for files that carry none)."""
    stored_alt, stored_caption = figure_text(data)
    alt, caption = stored_alt or alt, stored_caption or stored_alt or caption
    if is_png(data):
        if not _decodes(data):
            return Figure(caption, alt, problem="a corrupted PNG", name=name)
        return Figure(caption, alt, data_uri=png_data_uri(data), name=name)
    try:
        return Figure(caption, alt, svg=inline_svg(data, prefix, alt or caption), name=name)
    except ValueError as e:
        return Figure(caption, alt, problem=f"not a PNG or SVG file: {e}", name=name)


def load_figure(folder: Path, rel: str, prefix: str, *, alt: str, caption: str) -> Figure:
    """The figure at `folder/rel`, or a placeholder Figure saying what is wrong with it."""
    root = folder.resolve()
    path = (folder / rel).resolve()
    if not path.is_relative_to(root):
        return Figure(caption, alt, problem="outside the study folder", name=rel)
    if not path.is_file():
        return Figure(caption, alt, problem="missing", name=rel)
    return figure_from_bytes(path.read_bytes(), prefix, alt=alt, caption=caption, name=rel)
