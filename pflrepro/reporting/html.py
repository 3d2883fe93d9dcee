"""The report as one HTML page: its markdown rendered, the figures inlined by path."""
from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

CSS = """body{font-family:system-ui,sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;line-height:1.45;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.6em 0}th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top}
th{background:#f3f3f3}.tw{overflow-x:auto}img{max-width:100%;border:1px solid #eee;margin:.4em 0}
blockquote{color:#555;border-left:3px solid #ccc;margin:.5em 0;padding-left:.8em}code{background:#f5f5f5;padding:0 3px}
td.v-holds{background:#d9f2d9}td.v-partial{background:#e8f5d0}td.v-fails{background:#f8d4d4}
td.v-inconclusive{background:#fdf2c8}td.v-underpowered{background:#eeeeee}td.v-by-design{color:#555;font-style:italic}td.v-not-run{color:#777}
h2{border-bottom:2px solid #ddd;margin-top:2em}h3{margin-top:1.6em}details{margin:.5em 0}.path{font-family:monospace}"""


def _markdown_to_html(md: str) -> str:
    import mistune
    return mistune.create_markdown(escape=False, plugins=["table"])(md)


def to_html(md: str, base: Path, title: str = "Reproduction report") -> str:
    """The markdown as one self-contained page: images read (relative to `base`) and embedded as data URIs,
    links to anything but an anchor on the page shown as text."""
    body = _markdown_to_html(md)

    def embed(m):
        tag = m.group(0)
        src = re.search(r'\ssrc="([^"]*)"', tag)
        if src is None or src.group(1).startswith("data:"):
            return tag
        path = Path(os.path.normpath(base / html.unescape(src.group(1))))
        if not path.is_file():
            return f"<em>(missing figure {html.escape(path.name)})</em>"
        uri = "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()
        return tag[:src.start()] + f' src="{uri}"' + tag[src.end():]
    body = re.sub(r"<img\b[^>]*>", embed, body)
    body = re.sub(r'<a href="(?!#)[^"]*"[^>]*>(.*?)</a>', r'<span class="path">\1</span>', body, flags=re.S)
    body = re.sub(r"<td>(holds|partial|fails|inconclusive|underpowered|by design|not run)</td>",
                  lambda m: f'<td class="v-{m.group(1).replace(" ", "-")}">{m.group(1)}</td>', body)
    body = body.replace("<table>", '<div class="tw"><table>').replace("</table>", "</table></div>")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


