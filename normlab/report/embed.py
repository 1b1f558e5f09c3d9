"""Figures inside the page: SVG inlined as markup (crisp at any zoom, text selectable), PNG as a
`data:` URI, each with its caption and alt text (stored in the file by
`normlab.plotting.save_figure`, or given by the caller).

An SVG is input like any other: it is parsed as XML and written back with only drawing elements
and attributes (no script, no event handler, no foreign object, no style sheet, no reference that
leaves the figure), its ids prefixed so that several figures on one page never share one.
"""

from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

from normlab.plotting import figure_text

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
    root.attrib.pop("style", None)  # the figure's box is the page's to lay out
    root.set("role", "img")
    root.set("aria-label", alt)
    root.set("class", "figure")
    return ElementTree.tostring(root, encoding="unicode", short_empty_elements=True)


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
