"""Real media files for tests, made on the spot: a camera-like JPEG (large, with EXIF orientation and GPS), a PNG
chart and a PDF with a text layer (pypdf writes the page; a Type 1 base font needs no embedding)."""

from __future__ import annotations

import base64
import io

from PIL import Image, ImageDraw
from pypdf import PdfWriter
from pypdf.generic import ContentStream, DictionaryObject, NameObject

GPS_IFD = 0x8825
ORIENTATION = 0x0112


def camera_jpeg(width: int = 3000, height: int = 2000) -> bytes:
    """A JPEG as a phone takes it: large, EXIF with an orientation and a GPS position."""
    image = Image.new("RGB", (width, height), (30, 120, 200))
    ImageDraw.Draw(image).rectangle((width // 4, height // 4, width // 2, height // 2), fill=(250, 200, 0))
    exif = Image.Exif()
    exif[ORIENTATION] = 1
    exif[GPS_IFD] = {1: "N", 2: (52.0, 31.0, 12.0), 3: "E", 4: (13.0, 24.0, 36.0)}
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif, quality=85)
    return out.getvalue()


def png_chart(width: int = 320, height: int = 200) -> bytes:
    """A small PNG (a bar chart's look)."""
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for n, h in enumerate((60, 120, 90, 150)):
        draw.rectangle((20 + n * 70, height - h, 70 + n * 70, height), fill=(40, 90 + n * 30, 160))
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def pdf_with_text(*pages: str, user_password: str | None = None) -> bytes:
    """A PDF with one page per string, each string as the page's text (Helvetica); encrypted when
    ``user_password`` is given (the owner's password is always another)."""
    writer = PdfWriter()
    font = DictionaryObject({NameObject("/Type"): NameObject("/Font"), NameObject("/Subtype"): NameObject("/Type1"),
                             NameObject("/BaseFont"): NameObject("/Helvetica")})
    for text in pages:
        page = writer.add_blank_page(612, 792)
        page[NameObject("/Resources")] = DictionaryObject(
            {NameObject("/Font"): DictionaryObject({NameObject("/F1"): font})})
        escaped = text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
        stream = ContentStream(None, writer)
        stream.set_data(f"BT /F1 12 Tf 72 720 Td ({escaped}) Tj ET".encode())
        page.replace_contents(stream)
    if user_password is not None:
        writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="AES-128")
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def decoded_image(data_url: str) -> Image.Image:
    """The image a data URL carries (opened with Pillow)."""
    header, _, payload = data_url.partition(",")
    assert header.startswith("data:image/") and header.endswith(";base64"), header
    return Image.open(io.BytesIO(base64.b64decode(payload)))
