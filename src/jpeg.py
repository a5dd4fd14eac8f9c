"""What a JPEG's own header says about it, read without decoding.

Walking the marker segments to the frame header costs microseconds, where opening the image
with PIL parses every table too. data2rec uses it to sort JPEGs it may pass through from ones
it must re-encode; the loaders use it to size crops before decoding.
"""

from __future__ import annotations

# SOFn markers carry the frame size; C4 (DHT), C8 (reserved) and CC (DAC) share the range.
SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def jpeg_info(data: bytes | memoryview) -> tuple[int, int, int, int, int] | None:
    """(width, height, components, bits, SOF marker) from a JPEG's frame header, or None when
    `data` is not a JPEG or ends before its frame header."""
    n = len(data)
    if n < 4 or data[0] != 0xFF or data[1] != 0xD8:
        return None
    i = 2
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker in (0xD9, 0xDA):  # end of image or start of scan before any frame header
            return None
        if marker in SOF_MARKERS:
            if i + 10 > n:
                return None
            bits, comps = data[i + 4], data[i + 9]
            height = (data[i + 5] << 8) | data[i + 6]
            width = (data[i + 7] << 8) | data[i + 8]
            return width, height, comps, bits, marker
        i += 2 + ((data[i + 2] << 8) | data[i + 3])
    return None
