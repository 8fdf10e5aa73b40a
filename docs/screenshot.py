"""Full-page screenshot of a posbias report with headless Chromium (the docs' figure of the report).

    python docs/screenshot.py report.html docs/report.png [--width 1200]

Uses the same DevTools driver as the browser test (tests/browser.py; the Debian package `chromium`,
or the binary named by $CHROMIUM). Exits 1 if the page has a broken image or a console error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import check_page, screenshot  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("html", type=Path)
    ap.add_argument("png", type=Path)
    ap.add_argument("--width", type=int, default=1200)
    args = ap.parse_args()
    check = check_page(args.html)
    if check.broken_images or check.errors:
        print(f"{args.html}: {len(check.broken_images)} broken image(s), errors: {check.errors}", file=sys.stderr)
        return 1
    screenshot(args.html, args.png, width=args.width)
    print(f"wrote {args.png} ({len(check.images)} images decoded, no console errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
