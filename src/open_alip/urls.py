"""URLs in what the toolkit shows or stores, without the credentials a URL may carry.

`HF_ENDPOINT=https://user:password@mirror` is a valid way to reach a mirror behind basic auth;
the user info must then never reach a report, a log line, a state file or an error message. Every
place that writes an endpoint or a tool's message that may hold one passes it through here.
"""

from __future__ import annotations

import re

# scheme://userinfo@ : the user info runs to the last "@" before the host's end ("/", "?", "#" or
# whitespace), so a password holding an "@" is taken whole.
_USERINFO = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s]*@")


def redact_urls(text: str) -> str:
    """`text` with the user info of every URL in it removed (`http://u:pw@host/x` -> `http://host/x`)."""
    return _USERINFO.sub(r"\1", text)
