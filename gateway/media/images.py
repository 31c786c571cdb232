"""Images made fit for a model: upright (EXIF orientation applied), no larger than needed, and carrying nothing but
pixels (EXIF with its GPS position, colour profiles and comments are all left behind)."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from gateway.media.errors import MediaError

MAX_PIXELS = 60_000_000
"""The largest image decoded (the camera photos of phones are 12 to 50 megapixels); larger ones are refused from
their header, before any decoding (a decompression bomb is a small file that claims a huge size)."""
JPEG_QUALITY = 85


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """An image re-encoded for a model: JPEG, or PNG when it has transparency."""

    data: bytes
    mime: str
    width: int
    height: int


def _pixels_refused(width: int, height: int) -> MediaError:
    return MediaError(f"the image is too large ({width}×{height} pixels; at most {MAX_PIXELS // 1_000_000} "
                      "megapixels are read).")


def prepare_image(data: bytes, max_side: int) -> PreparedImage:
    """``data`` decoded (the first frame of an animation), turned upright, downscaled so that its longer side is
    at most ``max_side`` pixels, and re-encoded without any metadata; ``MediaError`` when it is not an image
    Pillow reads, is corrupt, or is too large."""
    try:
        with Image.open(io.BytesIO(data)) as opened:
            if opened.width * opened.height > MAX_PIXELS:
                raise _pixels_refused(opened.width, opened.height)
            opened.draft(None, (max_side, max_side))  # JPEG: decode at a reduced scale when that is enough
            upright = ImageOps.exif_transpose(opened)
    except Image.DecompressionBombError as exc:  # Pillow's own limit, met before ours by far larger claims
        raise MediaError("the image is too large (it claims far more pixels than can be read).") from exc
    except UnidentifiedImageError as exc:
        raise MediaError("the file is not an image that can be read.") from exc
    except (OSError, SyntaxError, ValueError) as exc:  # Pillow's ways of saying the data is truncated or corrupt
        raise MediaError("the image is damaged and cannot be read.") from exc
    alpha = upright.has_transparency_data
    pixels = upright.convert("RGBA" if alpha else "RGB")
    if alpha and pixels.getchannel("A").getextrema() == (255, 255):
        pixels, alpha = pixels.convert("RGB"), False  # an alpha channel that hides nothing
    pixels.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    pixels.info.clear()  # no EXIF, ICC profile, comment or text chunk reaches the encoder
    out = io.BytesIO()
    if alpha:
        pixels.save(out, "PNG", optimize=True)
    else:
        pixels.save(out, "JPEG", quality=JPEG_QUALITY, optimize=True)
    return PreparedImage(out.getvalue(), "image/png" if alpha else "image/jpeg", pixels.width, pixels.height)


def data_url(prepared: PreparedImage) -> str:
    """``prepared`` as a ``data:`` URL, the form image content parts carry it in."""
    return f"data:{prepared.mime};base64,{base64.b64encode(prepared.data).decode('ascii')}"
