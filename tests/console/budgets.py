"""An admin's walk through the console's Budgets view in a real headless Chromium (Debian's
package, driven by Playwright): an analyst is told the view needs an admin; the admin reads
each budget's histogram with the live and the suggested value, the replay against the live
policy and the hold-out, and runs the suggestion as a canary, which the Policy view then
shows. Run by tests/api/console.rs against an instance with a traffic record.

    python3 tests/console/budgets.py BASE_URL ADMIN_TOKEN ANALYST_TOKEN [SCREENSHOT_DIR]

Exits non-zero with the failed step on stderr.
"""

import os
import re
import sys

from playwright.sync_api import expect, sync_playwright

BASE, ADMIN, ANALYST = sys.argv[1], sys.argv[2], sys.argv[3]
SHOTS = sys.argv[4] if len(sys.argv) > 4 else None
CHROMIUM = os.environ.get("PALISADE_CHROMIUM", "/usr/bin/chromium")


def sign_in(page, token):
    page.goto(BASE + "/console")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # An analyst may not ask for suggestions: the view says what it needs.
        sign_in(page, ANALYST)
        page.get_by_role("link", name="Budgets").click()
        expect(page.get_by_role("heading", name="Budgets")).to_be_visible()
        expect(page.get_by_text("needs an admin token")).to_be_visible()
        page.get_by_role("button", name="Sign out").click()

        # The admin: a histogram per budget that met honest traffic, live and suggested drawn.
        sign_in(page, ADMIN)
        page.get_by_role("link", name="Budgets").click()
        expect(page.get_by_role("heading", name="Budgets")).to_be_visible()
        anon = page.locator('.card.budget[data-budget="ip-anon"]')
        # The suggestion reads the whole recorded window twice and replays it twice (the
        # debug build, beside the other tests): seconds, not milliseconds.
        expect(anon).to_be_visible(timeout=60_000)
        # The readers make at most 21 reads a period (more when real time places a seventh
        # tick in a window): well under the live 60.
        expect(anon).to_contain_text(re.compile(r"live 60, suggested \d+"))
        chart = anon.locator("svg.histogram")
        expect(chart.locator("line.live")).to_have_count(1)
        expect(chart.locator("line.suggested")).to_have_count(1)
        assert chart.locator("rect").count() >= 2, "the readers' buckets are drawn"
        box = chart.bounding_box()
        assert box["width"] >= 250, f"the histogram is {box['width']}px wide"
        # Live (60) is drawn right of suggested: the scale is the values'.
        live_x = float(chart.locator("line.live").get_attribute("x1"))
        suggested_x = float(chart.locator("line.suggested").get_attribute("x1"))
        assert live_x > suggested_x, (live_x, suggested_x)
        expect(page.locator("tbody tr", has_text="user-read")).to_have_count(1)
        read = page.locator("tbody tr", has_text="read").filter(has_text="read").first
        expect(read).to_be_visible()
        expect(page.locator("#holdout")).to_contain_text("met")
        if SHOTS:
            page.screenshot(path=os.path.join(SHOTS, "budgets.png"), full_page=True)

        # One click makes the suggestion a canary, with a reason.
        page.get_by_role("button", name="Run as a canary").click()
        expect(page.locator("#status .error")).to_contain_text("Give a reason")
        page.locator("#canary-reason").fill("suggested from the last day")
        page.get_by_role("button", name="Run as a canary").click()
        expect(page.locator("#status .info")).to_contain_text("Canary")
        page.get_by_role("link", name="Policy").click()
        expect(page.get_by_text("suggested from the last day", exact=False)).to_be_visible()

        assert not errors, f"page errors: {errors}"
        browser.close()


if __name__ == "__main__":
    try:
        main()
    except Exception as err:  # the failed step, said once
        print(f"budgets walk failed: {err}", file=sys.stderr)
        sys.exit(1)
