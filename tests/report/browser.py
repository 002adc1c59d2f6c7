"""Open an HTML report in headless Chromium and read back what the browser saw.

A copy of the page gets a small script that, once the page has loaded, records on <body> how
many <img> elements there are, how many failed to decode (naturalWidth 0), how many cells carry
the runner's error tag and whether the failure banner is present; ``--dump-dom`` prints the DOM.
External hosts (the CDN MathJax / require.js) are mapped to NOTFOUND so the check is offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

CHROMIUM = next(
    (
        p
        for p in (os.environ.get("CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"))
        if p and os.path.exists(p)
    ),
    None,
)

_PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var b = document.body;
  b.setAttribute('data-wb-loaded', '1');
  b.setAttribute('data-wb-images', imgs.length);
  var broken = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
  b.setAttribute('data-wb-broken', broken.length);
  b.setAttribute('data-wb-errors', document.querySelectorAll('.celltag_workbench-error').length);
  b.setAttribute('data-wb-banner', document.getElementById('workbench-failure') ? 1 : 0);
});
</script>"""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--virtual-time-budget=10000",
]


def open_page(html: Path, tmp: Path) -> dict[str, int | str]:
    """Load ``html`` in Chromium; return {loaded, images, broken, errors, banner, dom}."""
    if CHROMIUM is None:
        raise RuntimeError("Chromium not found: apt-get install -y chromium (or set CHROMIUM=/path)")
    text = html.read_text(encoding="utf-8")
    base = f'<base href="{html.parent.resolve().as_uri()}/">'      # relative links resolve where the page is
    text = text.replace("<head>", "<head>" + base, 1) if "<head>" in text else base + text
    probe = tmp / f"probe-{html.name}"
    probe.write_text(
        text.replace("</body>", _PROBE + "</body>", 1) if "</body>" in text else text + _PROBE,
        encoding="utf-8",
    )
    profile = tmp / f"chromium-profile-{html.stem}"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", probe.as_uri()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
    body = re.search(r"<body([^>]*)>", r.stdout)
    attrs = dict(re.findall(r'data-wb-(\w+)="(\d+)"', body.group(1))) if body else {}
    keys = ("loaded", "images", "broken", "errors", "banner")
    out: dict[str, int | str] = {k: int(attrs.get(k, -1)) for k in keys}
    out["dom"] = r.stdout
    return out
