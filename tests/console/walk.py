"""An analyst's walk through the console in a real headless Chromium (Debian's package,
driven by Playwright): sign in, find the accounts a scripted attack locked, read why, release
them in bulk, see the audit entry. Run by tests/api/console.rs against a seeded instance.

    python3 tests/console/walk.py BASE_URL ANALYST_TOKEN [SCREENSHOT_DIR]

Exits non-zero with the failed step on stderr.
"""

import os
import sys

from playwright.sync_api import expect, sync_playwright

BASE, TOKEN = sys.argv[1], sys.argv[2]
SHOTS = sys.argv[3] if len(sys.argv) > 3 else None
CHROMIUM = os.environ.get("PALISADE_CHROMIUM", "/usr/bin/chromium")


def shot(page, name):
    if SHOTS:
        page.screenshot(path=os.path.join(SHOTS, name + ".png"), full_page=True)


def main():
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        page = context.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "console",
            lambda m: errors.append(m.text) if m.type == "error" else None,
        )
        urls = []
        page.on("request", lambda r: urls.append(r.url))

        # Sign in: a wrong token is refused with a message, the analyst token gets in.
        page.goto(BASE + "/console")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        shot(page, "signin")
        page.get_by_label("API token").fill("pal_not_a_token")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#status .error")).to_contain_text("Sign-in failed")
        errors.clear()  # the refused sign-in logs its 401 in the console
        page.get_by_label("API token").fill(TOKEN)
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.locator("#active-count")).to_have_text("5")
        # The login guard and the threshold in force.
        expect(page.locator("#guard-state")).to_have_text("off")
        expect(page.locator("#guard-threshold")).to_contain_text("failures from unknown contexts")
        expect(page.locator("#guard-threshold")).to_contain_text("of 100 ")
        expect(page.get_by_text("auth", exact=True).first).to_be_visible()
        shot(page, "overview")

        # Lockouts from the attacking network.
        page.get_by_role("link", name="Lockouts", exact=True).click()
        expect(page.get_by_role("heading", name="Lockouts")).to_be_visible()
        page.get_by_label("IP or CIDR").fill("198.51.100.0/24")
        page.get_by_role("button", name="Search").click()
        rows = page.locator("tbody tr")
        expect(rows).to_have_count(3)
        for account in ["victim-1", "victim-2", "victim-3"]:
            expect(page.get_by_role("link", name=account, exact=True)).to_be_visible()
        shot(page, "lockouts")

        # Why was victim-1 locked?
        page.get_by_role("link", name="victim-1", exact=True).click()
        expect(page.get_by_role("heading", name="Account victim-1")).to_be_visible()
        expect(page.get_by_text("account_failures, 10 failures").first).to_be_visible()
        expect(page.get_by_text("Failed login from 198.51.100.7").first).to_be_visible()
        expect(page.locator("text=locked").first).to_be_visible()
        refusal = page.locator("tbody tr", has_text="limited: account_locked")
        expect(refusal).to_contain_text("lockout")
        expect(refusal.locator("td").nth(2)).to_have_text("2")
        shot(page, "account")
        # A data-subject export is offered as a download, not shown in a URL.
        page.get_by_role("button", name="Export everything stored (data-subject request)").click()
        with page.expect_download() as download:
            page.get_by_role("link", name="Download the export (JSON)").click()
        path = download.value.path()
        with open(path, encoding="utf-8") as f:
            exported = __import__("json").load(f)
        assert exported["account"] == "victim-1" and len(exported["auth_events"]) == 10

        # The lockout's end moves from its page.
        page.goto(BASE + "/console#/lockouts?account=victim-2&status=active")
        page.get_by_role("link", name="Details").click()
        expect(page.get_by_role("heading", name="Lockout of victim-2")).to_be_visible()
        page.get_by_label("Reason").fill("incident review needs an hour")
        page.get_by_role("button", name="Extend or shorten").click()
        expect(page.locator("#status .info")).to_contain_text("The lockout now ends at")

        # The attacking IP's page: the accounts it went for.
        page.get_by_label("Account or IP").fill("198.51.100.7")
        page.get_by_role("button", name="Look up").click()
        expect(page.get_by_role("heading", name="IP 198.51.100.7")).to_be_visible()
        expect(page.get_by_role("link", name="victim-2", exact=True).first).to_be_visible()
        shot(page, "ip")

        # Bulk release: preview first, then release.
        page.goto(BASE + "/console#/lockouts?ip=198.51.100.0%2F24&status=active")
        expect(page.locator("tbody tr")).to_have_count(3)
        page.get_by_role("button", name="Release all matching…").click()
        expect(page.locator("#status .error")).to_contain_text("Give a reason")
        page.locator("#release-reason").fill("incident 7: test network, verified")
        page.get_by_role("button", name="Release all matching…").click()
        expect(page.locator("#release-preview")).to_contain_text(
            "3 lockout(s) would be released"
        )
        page.get_by_role("button", name="Release 3").click()
        expect(page.locator("#status .info")).to_contain_text("Released 3 lockouts")
        expect(page.get_by_text("No lockouts match.")).to_be_visible()

        # The audit entry says who and why.
        page.get_by_role("link", name="Audit log").click()
        expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
        entry = page.locator("tbody tr", has_text="lockout.bulk_release")
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text("ana (analyst)")
        expect(entry).to_contain_text("incident 7: test network, verified")
        shot(page, "audit")

        # Overrides and the canary in force.
        page.get_by_role("link", name="Policy").click()
        expect(page.get_by_role("heading", name="Policy")).to_be_visible()
        override = page.locator("tbody tr", has_text="launch day")
        expect(override).to_have_count(1)
        expect(override.get_by_role("link", name="partner")).to_be_visible()
        expect(page.get_by_text("try 20 anonymous reads a minute", exact=False)).to_be_visible()
        shot(page, "policy")

        # An account name written as markup is shown as text, never run.
        page.goto(BASE + "/console#/failing")
        expect(page.get_by_role("heading", name="Failing, not locked")).to_be_visible()
        page.goto(BASE + "/console#/lockouts")
        expect(page.get_by_text("<img src=x onerror=window.pwned=1>")).to_be_visible()
        assert page.evaluate("window.pwned") is None, "markup in an account name ran"

        # Keyboard: the skip link comes first.
        page.reload()
        expect(page.get_by_role("heading", name="Lockouts")).to_be_visible()
        page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.className") == "skip"

        # The token never travels in a URL and stays in this tab's session storage.
        assert not any(TOKEN in url for url in urls), "the token appeared in a URL"
        assert page.evaluate("sessionStorage.getItem('palisade.token')") == TOKEN
        assert page.evaluate("localStorage.length") == 0

        # Readable on a phone.
        phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True)
        mobile = phone.new_page()
        mobile.goto(BASE + "/console")
        mobile.get_by_label("API token").fill(TOKEN)
        mobile.get_by_role("button", name="Sign in").click()
        expect(mobile.get_by_role("heading", name="Overview")).to_be_visible()
        width = mobile.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"the overview scrolls sideways on a phone ({width}px)"
        shot(mobile, "phone")

        # Sign out forgets the token.
        page.get_by_role("button", name="Sign out").click()
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        assert page.evaluate("sessionStorage.getItem('palisade.token')") is None

        assert not errors, f"errors in the page: {errors}"
        browser.close()
    print("console walk: ok")


if __name__ == "__main__":
    main()
